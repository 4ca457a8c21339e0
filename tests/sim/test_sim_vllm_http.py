"""The simulated `vllm serve`'s OpenAI-compatible answers, read raw and by the `openai` client."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import attrs
import httpx
import openai
import pytest

from gpugate.core.units import GiB, MiB
from gpugate_sim.device import SimDevice, SimulatedGpuHost
from gpugate_sim.vllm import SimVllm, VllmServerSpec
from gpugate_sim.vllm.openai import WORDS

WAIT = 20.0


def server_spec(**changes: object) -> VllmServerSpec:
    values: dict[str, object] = {
        "listen": "127.0.0.1:0",
        "model": "/models/Qwen3-0.6B",
        "served_model_names": ("qwen", "qwen-alias"),
        "max_model_len": 4096,
        "weights": 1200 * MiB,
        "tokens_per_second": 2000.0,
        "version": "0.33.0",
    }
    values.update(changes)
    return VllmServerSpec(**values)  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def gpu(tmp_path_factory: pytest.TempPathFactory) -> SimulatedGpuHost:
    directory: Path = tmp_path_factory.mktemp("vllm-http") / "gpu"
    return SimulatedGpuHost.create(directory, [SimDevice(0, 48 * GiB, 0, "GPU-h", "sim")])


@pytest.fixture(scope="module")
def url(gpu: SimulatedGpuHost) -> Iterator[str]:
    with SimVllm(server_spec(gpu_memory_utilization=0.3), gpu.directory) as sim:
        assert sim.url is not None
        yield sim.url


@pytest.fixture
def client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=url + "/v1", api_key="EMPTY", max_retries=0)


def test_health_version_and_models(url: str) -> None:
    health = httpx.get(url + "/health")
    assert (health.status_code, health.content) == (200, b"")
    assert health.headers["server"] == "uvicorn"
    assert httpx.get(url + "/version").json() == {"version": "0.33.0"}
    models = httpx.get(url + "/v1/models").json()
    assert models["object"] == "list"
    assert [m["id"] for m in models["data"]] == ["qwen", "qwen-alias"]
    card = models["data"][0]
    assert (card["object"], card["owned_by"], card["root"], card["parent"]) == (
        "model",
        "vllm",
        "/models/Qwen3-0.6B",
        None,
    )
    assert card["max_model_len"] == 4096
    assert card["permission"][0]["object"] == "model_permission"


def test_chat_completion_through_the_openai_client(client: openai.OpenAI) -> None:
    answer = client.chat.completions.create(
        model="qwen-alias", messages=[{"role": "user", "content": "one two three"}], max_tokens=4
    )
    assert answer.object == "chat.completion" and answer.id.startswith("chatcmpl-")
    assert answer.model == "qwen-alias"
    assert answer.choices[0].message.content == "The quick brown fox"
    assert answer.choices[0].finish_reason == "length"
    assert answer.usage is not None
    assert (answer.usage.prompt_tokens, answer.usage.completion_tokens) == (3, 4)


def test_a_chat_stream_starts_with_the_role_and_ends_with_a_reason(
    client: openai.OpenAI,
) -> None:
    chunks = list(
        client.chat.completions.create(
            model="qwen",
            messages=[{"role": "user", "content": "hi"}],
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    # Sixteen tokens (the simulator's natural length), then "stop".
    assert text == " ".join(WORDS[:16])
    finals = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finals[-1] == "stop" and set(finals[:-1]) == {None}
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == 16


def test_a_completion_stream_is_sse_ending_with_done(url: str) -> None:
    body = {"model": "qwen", "prompt": "a b", "max_tokens": 2, "stream": True}
    with httpx.stream("POST", url + "/v1/completions", json=body, timeout=WAIT) as r:
        assert r.headers["content-type"].startswith("text/event-stream")
        lines = [line for line in r.iter_lines() if line]
    assert lines[-1] == "data: [DONE]"
    events = [json.loads(line[len("data: ") :]) for line in lines[:-1]]
    assert [e["object"] for e in events] == ["text_completion"] * 2
    assert [e["choices"][0]["text"] for e in events] == ["The", " quick"]
    assert "usage" not in events[-1]


def test_an_unknown_model_is_404_in_vllms_shape(url: str, client: openai.OpenAI) -> None:
    answer = httpx.post(
        url + "/v1/chat/completions",
        json={"model": "gpt-4", "messages": [{"role": "user", "content": "x"}]},
    )
    assert answer.status_code == 404
    assert answer.content == (
        b'{"error":{"message":"The model `gpt-4` does not exist.",'
        b'"type":"NotFoundError","param":"model","code":404}}'
    )
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="gpt-4", prompt="x")


def test_bad_bodies_and_routes(url: str) -> None:
    bad = httpx.post(url + "/v1/chat/completions", content=b"{not json")
    assert bad.status_code == 400 and bad.json()["error"]["code"] == 400
    missing = httpx.post(url + "/v1/chat/completions", json={"model": "qwen"})
    assert missing.status_code == 400
    assert httpx.get(url + "/nowhere").json() == {"detail": "Not Found"}
    wrong = httpx.get(url + "/v1/chat/completions")
    assert (wrong.status_code, wrong.json()) == (405, {"detail": "Method Not Allowed"})
    # A generating model has no embeddings route, and no sleep routes without dev mode.
    assert httpx.post(url + "/v1/embeddings", json={"input": "x"}).status_code == 404
    assert httpx.post(url + "/sleep").status_code == 404


def test_a_pooling_model_serves_embeddings_only(gpu: SimulatedGpuHost) -> None:
    embedder = server_spec(runner="pooling", served_model_names=("bge",), weights=600 * MiB)
    with SimVllm(attrs.evolve(embedder, gpu_memory_utilization=0.2), gpu.directory) as sim:
        assert sim.url is not None
        client = openai.OpenAI(base_url=sim.url + "/v1", api_key="EMPTY", max_retries=0)
        answer = client.embeddings.create(model="bge", input=["one", "two words"])
        assert [d.index for d in answer.data] == [0, 1]
        assert len(answer.data[0].embedding) == 16
        assert answer.data[0].embedding != answer.data[1].embedding
        assert answer.usage.prompt_tokens == 3
        chat = httpx.post(sim.url + "/v1/chat/completions", json={"messages": []})
        assert chat.status_code == 404
