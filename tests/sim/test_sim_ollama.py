"""The simulated Ollama driven by the official `ollama` and `openai` Python clients."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import datetime, timedelta
from pathlib import Path

import aiohttp
import ollama
import openai
import pytest

from gpugate.core.units import GiB
from gpugate_sim.device import SimulatedGpuHost
from gpugate_sim.ollama import SimOllama
from gpugate_sim.ollama.state import SimState
from gpugate_sim.scenario import OllamaModelSpec, OllamaSpec

CHAT = OllamaModelSpec(
    "llama3.2",
    size=3 * GiB,
    load_seconds=0.02,
    kv_bytes_per_token=64 * 1024,
    parameter_size="3.2B",
    family="llama",
)
EMBED = OllamaModelSpec(
    "bge-m3", size=1 * GiB, load_seconds=0.02, embedding=True, embedding_length=8, family="bert"
)

MakeSim = Callable[..., Awaitable[SimOllama]]


@pytest.fixture
async def make_sim(sim_host: SimulatedGpuHost) -> AsyncIterator[MakeSim]:
    """Start SimOllama servers on free ports; on teardown, check no runner survives."""
    started: list[SimOllama] = []

    async def make(*models: OllamaModelSpec, **fields: object) -> SimOllama:
        fields.setdefault("tokens_per_second", 5000.0)
        spec = OllamaSpec(models=models or (CHAT, EMBED), **fields)  # type: ignore[arg-type]
        sim = SimOllama(spec, sim_host)
        await sim.start("127.0.0.1", 0)
        started.append(sim)
        return sim

    yield make
    for sim in started:
        pids = [r.pid for r in sim.state().runners if r.pid is not None]
        await sim.close()
        assert [pid for pid in pids if Path(f"/proc/{pid}").exists()] == []
    assert sim_host.read().processes == []


@pytest.fixture
async def sim(make_sim: MakeSim) -> SimOllama:
    return await make_sim()


@pytest.fixture
async def client(sim: SimOllama) -> AsyncIterator[ollama.AsyncClient]:
    api = ollama.AsyncClient(host=sim.url)
    yield api
    await api.close()


@pytest.fixture
async def oai(sim: SimOllama) -> AsyncIterator[openai.AsyncOpenAI]:
    api = openai.AsyncOpenAI(base_url=f"{sim.url}/v1", api_key="ollama", max_retries=0)
    yield api
    await api.close()


def idle(model: str) -> Callable[[SimState], bool]:
    """The model is loaded and no request holds it."""

    def check(state: SimState) -> bool:
        runner = state.runner(model)
        return runner is not None and runner.refcount == 0 and runner.expires_at is not None

    return check


def unloaded(model: str) -> Callable[[SimState], bool]:
    return lambda state: state.runner(model) is None


# -- generation ------------------------------------------------------------------------


async def test_chat_streams_tokens_then_a_done_chunk_with_metrics(
    client: ollama.AsyncClient, sim: SimOllama
) -> None:
    parts = [
        part
        async for part in await client.chat(
            model="llama3.2", messages=[{"role": "user", "content": "why is the sky blue?"}],
            stream=True,
        )
    ]  # fmt: skip
    assert len(parts) >= 2
    assert all(not p.done and p.message.content for p in parts[:-1])
    final = parts[-1]
    assert final.done and final.done_reason == "stop" and final.message.content == ""
    assert final.eval_count == len(parts) - 1
    assert final.prompt_eval_count and final.total_duration and final.eval_duration
    counters = sim.state().counters
    assert (counters.generations_started, counters.generations_completed) == (1, 1)
    assert counters.loads == 1


async def test_chat_and_generate_are_deterministic_in_the_prompt(
    client: ollama.AsyncClient,
) -> None:
    messages = [{"role": "user", "content": "tell me a story"}]
    first = await client.chat(model="llama3.2", messages=messages)
    second = await client.chat(model="llama3.2", messages=messages)
    other = await client.chat(
        model="llama3.2:latest", messages=[{"role": "user", "content": "other"}]
    )
    assert first.message.content == second.message.content
    assert first.message.content != other.message.content
    generated = await client.generate(model="llama3.2", prompt="tell me a story")
    assert generated.done and generated.done_reason == "stop" and generated.response
    assert generated.context and all(isinstance(t, int) for t in generated.context)


async def test_num_predict_cuts_the_answer_with_done_reason_length(
    client: ollama.AsyncClient,
) -> None:
    full = await client.generate(model="llama3.2", prompt="count")
    assert full.eval_count is not None and full.eval_count > 3
    short = await client.generate(model="llama3.2", prompt="count", options={"num_predict": 3})
    assert (short.done_reason, short.eval_count) == ("length", 3)
    assert full.response.startswith(short.response)


async def test_stream_wire_format_is_ndjson_one_object_per_line(sim: SimOllama) -> None:
    async with (
        aiohttp.ClientSession() as session,
        session.post(f"{sim.url}/api/generate", json={"model": "llama3.2", "prompt": "hi"}) as resp,
    ):
        assert resp.status == 200
        assert resp.headers["Content-Type"] == "application/x-ndjson"
        body = await resp.text()
    lines = body.split("\n")
    assert lines[-1] == ""  # every object ends with a newline, and nothing follows
    objects = [json.loads(line) for line in lines[:-1]]
    assert [o["done"] for o in objects] == [False] * (len(objects) - 1) + [True]
    assert objects[-1]["done_reason"] == "stop" and "context" in objects[-1]


async def test_non_streaming_answer_is_one_json_object(sim: SimOllama) -> None:
    async with (
        aiohttp.ClientSession() as session,
        session.post(
            f"{sim.url}/api/chat",
            json={"model": "llama3.2", "messages": [{"role": "user", "content": "x"}],
                  "stream": False},
        ) as resp,
    ):  # fmt: skip
        assert resp.headers["Content-Type"] == "application/json; charset=utf-8"
        body = await resp.json()
    assert body["done"] is True and body["message"]["role"] == "assistant"
    assert body["message"]["content"] and body["model"] == "llama3.2"


async def test_load_only_requests_answer_done_reason_load(
    client: ollama.AsyncClient, sim: SimOllama
) -> None:
    loaded = await client.generate(model="llama3.2")
    assert (loaded.done, loaded.done_reason, loaded.response) == (True, "load", "")
    chat = await client.chat(model="llama3.2", messages=[])
    assert chat.done_reason == "load" and chat.message.content == ""
    state = sim.state()
    assert state.counters.loads == 1 and state.counters.generations_started == 0
    assert state.runner("llama3.2:latest") is not None


async def test_embed_and_legacy_embeddings_return_deterministic_unit_vectors(
    client: ollama.AsyncClient,
) -> None:
    embedded = await client.embed(model="bge-m3", input=["alpha", "beta", "alpha"])
    vectors = embedded.embeddings
    assert len(vectors) == 3 and all(len(v) == 8 for v in vectors)
    assert vectors[0] == vectors[2] and vectors[0] != vectors[1]
    assert abs(sum(x * x for x in vectors[0]) - 1) < 1e-4
    legacy = await client.embeddings(model="bge-m3", prompt="alpha")
    assert legacy.embedding == pytest.approx(vectors[0], abs=1e-6)
    empty = await client.embed(model="bge-m3", input=[])
    assert empty.embeddings == []


async def test_chat_on_an_embedding_model_is_refused_without_loading(
    client: ollama.AsyncClient, sim: SimOllama
) -> None:
    with pytest.raises(ollama.ResponseError) as caught:
        await client.chat(model="bge-m3", messages=[{"role": "user", "content": "hi"}])
    assert caught.value.status_code == 400
    assert caught.value.error == '"bge-m3" does not support chat'
    with pytest.raises(ollama.ResponseError) as generate:
        await client.generate(model="bge-m3", prompt="hi")
    assert generate.value.error == '"bge-m3" does not support generate'
    assert sim.state().counters.loads == 0


# -- model management routes -----------------------------------------------------------


async def test_list_show_and_version(client: ollama.AsyncClient, sim: SimOllama) -> None:
    listed = await client.list()
    assert [m.model for m in listed.models] == ["llama3.2:latest", "bge-m3:latest"]
    assert listed.models[0].details is not None
    assert listed.models[0].details.parameter_size == "3.2B"
    shown = await client.show("llama3.2")
    assert shown.capabilities == ["completion"]
    assert shown.modelinfo is not None and shown.modelinfo["llama.context_length"] == 8192
    assert (await client.show("bge-m3")).capabilities == ["embedding"]
    async with aiohttp.ClientSession() as session:
        async with session.get(f"{sim.url}/api/version") as resp:
            assert await resp.json() == {"version": "0.33.0"}
        async with session.get(f"{sim.url}/") as resp:
            assert (resp.status, await resp.text()) == (200, "Ollama is running")
        async with session.head(f"{sim.url}/") as resp:
            assert resp.status == 200


async def test_ps_lists_loaded_models_with_ollama_fields(
    client: ollama.AsyncClient, sim: SimOllama
) -> None:
    assert (await client.ps()).models == []
    await client.generate(model="llama3.2", keep_alive="1h")
    await client.embed(model="bge-m3", input="x", keep_alive="10m")
    listed = (await client.ps()).models
    assert [m.model for m in listed] == ["llama3.2:latest", "bge-m3:latest"]  # longest first
    first = listed[0]
    assert first.name == first.model and first.digest and len(first.digest) == 64
    assert first.size == 3 * GiB and first.size_vram == 3 * GiB
    assert first.context_length == 4096
    assert first.details is not None and first.details.family == "llama"
    raw = sim.state().runner("llama3.2:latest")
    assert raw is not None and raw.pid is not None


async def test_unknown_model_errors_as_ollama_words_them(client: ollama.AsyncClient) -> None:
    for call in (
        client.generate(model="nope", prompt="x"),
        client.chat(model="nope", messages=[{"role": "user", "content": "x"}]),
        client.show("nope"),
    ):
        with pytest.raises(ollama.ResponseError) as caught:
            await call
        assert (caught.value.status_code, caught.value.error) == (404, "model 'nope' not found")
    with pytest.raises(ollama.ResponseError) as embed:
        await client.embed(model="nope", input="x")
    assert embed.value.error == 'model "nope" not found, try pulling it first'
    with pytest.raises(ollama.ResponseError) as cloud:
        await client.generate(model="gpt-oss:20b-cloud", prompt="x")
    assert cloud.value.status_code == 404


async def test_pull_streams_progress_and_fails_for_unknown_models(
    client: ollama.AsyncClient,
) -> None:
    statuses = [p.status async for p in await client.pull("llama3.2", stream=True)]
    assert statuses[0] == "pulling manifest" and statuses[-1] == "success"
    assert "verifying sha256 digest" in statuses and "writing manifest" in statuses
    progress = [s for s in statuses if s and s.startswith("pulling ") and s != "pulling manifest"]
    assert len(progress) >= 2
    assert (await client.pull("llama3.2")).status == "success"
    with pytest.raises(ollama.ResponseError) as streamed:
        async for _ in await client.pull("nope", stream=True):
            pass
    assert streamed.value.error == "pull model manifest: file does not exist"
    with pytest.raises(ollama.ResponseError) as whole:
        await client.pull("nope")
    assert whole.value.status_code == 500


# -- keep_alive ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("keep_alive", "seconds"),
    [
        (90, 90.0),
        (2.5, 2.5),
        ("5m", 300.0),
        ("1h30m", 5400.0),
        ("-1m", None),
        (-1, None),
    ],
)
async def test_keep_alive_formats_set_the_runner_duration(
    client: ollama.AsyncClient, sim: SimOllama, keep_alive: float | str, seconds: float | None
) -> None:
    await client.generate(model="llama3.2", keep_alive=keep_alive)
    runner = sim.state().runner("llama3.2:latest")
    assert runner is not None and runner.keep_alive == seconds


async def test_keep_alive_24h_shows_in_ps_expires_at(client: ollama.AsyncClient) -> None:
    before = datetime.now().astimezone()
    await client.generate(model="llama3.2", prompt="hi", keep_alive="24h")
    (entry,) = (await client.ps()).models
    assert entry.expires_at is not None
    ahead = entry.expires_at - before
    assert timedelta(hours=24) <= ahead < timedelta(hours=24, seconds=30)


async def test_negative_keep_alive_means_forever_in_ps(client: ollama.AsyncClient) -> None:
    await client.generate(model="llama3.2", keep_alive=-1)
    (entry,) = (await client.ps()).models
    assert entry.expires_at is not None and entry.expires_at.year > 2200


@pytest.mark.parametrize(
    ("keep_alive", "message"),
    [
        ("300", 'time: missing unit in duration "300"'),
        ("-1", 'time: missing unit in duration "-1"'),
        ("5 minutes", 'time: unknown unit " minutes" in duration "5 minutes"'),
        (True, "Unsupported type: 'bool'"),
        ([1], "Unsupported type: '[]interface {}'"),
    ],
)
async def test_bad_keep_alive_is_a_400_with_go_text(
    sim: SimOllama, keep_alive: object, message: str
) -> None:
    async with (
        aiohttp.ClientSession() as session,
        session.post(
            f"{sim.url}/api/generate", json={"model": "llama3.2", "keep_alive": keep_alive}
        ) as resp,
    ):
        assert (resp.status, await resp.json()) == (400, {"error": message})
    assert sim.state().counters.loads == 0


async def test_keep_alive_is_sticky_until_a_request_carries_one(
    client: ollama.AsyncClient, sim: SimOllama
) -> None:
    await client.generate(model="llama3.2", keep_alive="1h")
    await client.generate(model="llama3.2", prompt="no keep_alive here")
    runner = sim.state().runner("llama3.2:latest")
    assert runner is not None and runner.keep_alive == 3600.0
    await client.generate(model="llama3.2", prompt="shorter", keep_alive="2m")
    runner = sim.state().runner("llama3.2:latest")
    assert runner is not None and runner.keep_alive == 120.0


async def test_keep_alive_timer_unloads_an_idle_runner(
    client: ollama.AsyncClient, sim: SimOllama
) -> None:
    await client.generate(model="llama3.2", prompt="hi", keep_alive="400ms")
    runner = sim.state().runner("llama3.2:latest")
    assert runner is not None and runner.pid is not None and runner.keep_alive == 0.4
    state = await sim.wait_until(unloaded("llama3.2:latest"), timeout=5)
    assert state.counters.unloads == 1
    assert not Path(f"/proc/{runner.pid}").exists()
    assert (await client.ps()).models == []


async def test_keep_alive_zero_unloads_right_after_the_request(
    client: ollama.AsyncClient, sim: SimOllama
) -> None:
    answer = await client.generate(model="llama3.2", prompt="once", keep_alive="0s")
    assert answer.done_reason == "stop"
    await sim.wait_until(unloaded("llama3.2:latest"), timeout=5)
    embedded = await client.embed(model="bge-m3", input="x", keep_alive=0)
    assert len(embedded.embeddings) == 1
    state = await sim.wait_until(unloaded("bge-m3:latest"), timeout=5)
    assert (state.counters.loads, state.counters.unloads) == (2, 2)


async def test_unload_shortcut_answers_unload_without_loading(
    client: ollama.AsyncClient, sim: SimOllama
) -> None:
    nothing = await client.generate(model="llama3.2", keep_alive=0)
    assert (nothing.done, nothing.done_reason) == (True, "unload")
    assert sim.state().counters.loads == 0
    await client.generate(model="llama3.2", keep_alive=-1)
    chat = await client.chat(model="llama3.2", messages=[], keep_alive="0s")
    assert chat.done_reason == "unload"
    state = await sim.wait_until(unloaded("llama3.2:latest"), timeout=5)
    assert (state.counters.loads, state.counters.unloads) == (1, 1)
    with pytest.raises(ollama.ResponseError) as unknown:
        await client.generate(model="nope", keep_alive=0)
    assert unknown.value.status_code == 404


# -- the OpenAI-compatible routes ------------------------------------------------------


async def test_openai_chat_completion_whole_and_streamed(
    oai: openai.AsyncOpenAI, sim: SimOllama
) -> None:
    messages: list[openai.types.chat.ChatCompletionMessageParam] = [
        {"role": "user", "content": "hello"}
    ]
    whole = await oai.chat.completions.create(model="llama3.2", messages=messages)
    assert whole.object == "chat.completion" and whole.system_fingerprint == "fp_ollama"
    assert whole.choices[0].finish_reason == "stop" and whole.choices[0].message.content
    assert whole.usage is not None and whole.usage.completion_tokens > 0
    stream = await oai.chat.completions.create(
        model="llama3.2",
        messages=messages,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = [chunk async for chunk in stream]
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    assert chunks[-2].choices[0].finish_reason == "stop"
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert chunks[-1].usage.total_tokens == whole.usage.total_tokens


async def test_openai_completions_and_embeddings(oai: openai.AsyncOpenAI) -> None:
    completion = await oai.completions.create(model="llama3.2", prompt="once upon", max_tokens=4)
    assert completion.object == "text_completion"
    assert completion.choices[0].finish_reason == "length"
    assert completion.usage is not None and completion.usage.completion_tokens == 4
    streamed = await oai.completions.create(model="llama3.2", prompt="once upon", stream=True)
    text = "".join([c.choices[0].text async for c in streamed if c.choices])
    assert text.startswith(completion.choices[0].text)
    vectors = await oai.embeddings.create(model="bge-m3", input=["alpha", "beta"])
    assert [d.index for d in vectors.data] == [0, 1]
    assert all(len(d.embedding) == 8 for d in vectors.data)
    floats = await oai.embeddings.create(model="bge-m3", input="alpha", encoding_format="float")
    assert floats.data[0].embedding == pytest.approx(vectors.data[0].embedding, abs=1e-6)


async def test_openai_models_and_errors(oai: openai.AsyncOpenAI, sim: SimOllama) -> None:
    models = await oai.models.list()
    assert [m.id for m in models.data] == ["llama3.2:latest", "bge-m3:latest"]
    assert models.data[0].owned_by == "library"
    assert (await oai.models.retrieve("llama3.2")).id == "llama3.2"
    with pytest.raises(openai.NotFoundError) as missing:
        await oai.models.retrieve("nope")
    assert missing.value.body == {
        "message": "model 'nope' not found",
        "type": "not_found_error",
        "param": None,
        "code": None,
    }
    with pytest.raises(openai.NotFoundError):
        await oai.chat.completions.create(model="nope", messages=[{"role": "user", "content": "x"}])
    with pytest.raises(openai.BadRequestError) as empty:
        await oai.chat.completions.create(model="llama3.2", messages=[])
    assert "too short" in str(empty.value)
    assert sim.state().counters.loads == 0


async def test_openai_requests_ignore_keep_alive_and_runner_options(
    oai: openai.AsyncOpenAI, client: ollama.AsyncClient, sim: SimOllama
) -> None:
    await client.generate(model="llama3.2", keep_alive="1h")
    await oai.chat.completions.create(
        model="llama3.2",
        messages=[{"role": "user", "content": "hi"}],
        extra_body={"keep_alive": 0, "options": {"num_ctx": 8192}},
    )
    runner = sim.state().runner("llama3.2:latest")
    assert runner is not None and runner.keep_alive == 3600.0
    assert runner.options.num_ctx == 4096
    assert sim.state().counters.loads == 1


# -- request checking ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "body", "status", "message"),
    [
        ("/api/generate", b"", 400, "missing request body"),
        ("/api/generate", b'{"model": ', 400, "unexpected EOF"),
        ("/api/chat", b'{"model" "x"}', 400, "invalid character '\"' after object key"),
        (
            "/api/generate",
            b'{"model": 5}',
            400,
            "json: cannot unmarshal number into Go struct field "
            "GenerateRequest.model of type string",
        ),
        ("/api/chat", b'{"messages": []}', 400, "model is required"),
        ("/api/embed", b'{"model": "bge-m3", "input": 5}', 400, "invalid input type"),
        (
            "/api/generate",
            b'{"model": "llama3.2", "prompt": "x", "options": {"num_ctx": "big"}}',
            500,
            'option "num_ctx" must be of type integer',
        ),
    ],
)
async def test_bad_requests_get_ollama_errors(
    sim: SimOllama, path: str, body: bytes, status: int, message: str
) -> None:
    async with (
        aiohttp.ClientSession() as session,
        session.post(f"{sim.url}{path}", data=body) as resp,
    ):
        assert resp.status == status
        assert await resp.json() == {"error": message}
    assert sim.state().counters.loads == 0


async def test_unknown_routes_and_methods_answer_like_gin(sim: SimOllama) -> None:
    async with aiohttp.ClientSession() as session:
        async with session.get(f"{sim.url}/api/nothing") as resp:
            assert (resp.status, await resp.text()) == (404, "404 page not found")
        async with session.get(f"{sim.url}/api/generate") as resp:
            assert (resp.status, await resp.text()) == (405, "405 method not allowed")


@pytest.mark.parametrize(
    ("host", "status"),
    [
        ("evil.example.com", 403),
        ("8.8.8.8:11434", 403),
        ("localhost:11434", 200),
        ("127.0.0.1:11434", 200),
        ("10.1.2.3", 200),
        ("gpu-box.local", 200),
        ("ollama.internal:80", 200),
    ],
)
async def test_host_check_on_a_loopback_listener(sim: SimOllama, host: str, status: int) -> None:
    async with (
        aiohttp.ClientSession() as session,
        session.get(f"{sim.url}/api/tags", headers={"Host": host}) as resp,
    ):
        assert resp.status == status
        if status == 403:
            assert await resp.read() == b""


async def test_cors_refuses_foreign_origins_and_answers_preflights(sim: SimOllama) -> None:
    async with aiohttp.ClientSession() as session:
        foreign = {"Origin": "https://evil.example.com"}
        async with session.get(f"{sim.url}/api/tags", headers=foreign) as resp:
            assert (resp.status, await resp.read()) == (403, b"")
        local = {"Origin": "http://localhost:3000"}
        async with session.get(f"{sim.url}/api/tags", headers=local) as resp:
            assert resp.status == 200
            assert resp.headers["Access-Control-Allow-Origin"] == "http://localhost:3000"
        preflight = {**local, "Access-Control-Request-Method": "POST"}
        async with session.options(f"{sim.url}/api/chat", headers=preflight) as resp:
            assert resp.status == 204
            assert "X-Stainless-Retry-Count" in resp.headers["Access-Control-Allow-Headers"]


async def test_sim_state_route_serves_runners_and_counters(
    client: ollama.AsyncClient, sim: SimOllama
) -> None:
    await client.generate(model="llama3.2", prompt="hi", keep_alive=-1)
    async with (
        aiohttp.ClientSession() as session,
        session.get(f"{sim.url}/sim/state") as resp,
    ):
        state = await resp.json()
    (runner,) = state["runners"]
    assert runner["model"] == "llama3.2:latest" and runner["keep_alive"] is None
    assert runner["refcount"] == 0 and runner["options"]["num_ctx"] == 4096
    assert state["counters"]["generations_completed"] == 1
    assert state["counters"]["requests_in_flight"] == 0
