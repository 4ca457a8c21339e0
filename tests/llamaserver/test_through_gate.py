"""The real llama-server router behind the gate, driven by openai-python: every answer as
direct, every load under a lease, eviction by /models/unload, --models-max respected."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import aiohttp
import attrs
import httpx
import openai
import pytest

from gpugate.core.effects import Event, EventKind
from gpugate.core.residents import ResidentKey
from gpugate.gate.gate import Gate
from gpugate.runtimes.llamaserver import router as llama_router
from gpugate.runtimes.sections import load_config_text
from tests.llamaserver.conftest import LlamaServer, server_starter
from tests.llamaserver.gguf_models import write_models_dir
from tests.ports import free_ports
from tests.serving import GATE_PREAMBLE, serving

MODELS = ("alpha", "beta", "gamma")

CONFIG = (
    GATE_PREAMBLE
    + """\
  llama:
    runtime: llama-server
    listen: 127.0.0.1:{listen}
    upstream: {upstream}
    class: interactive
    residency: {{policy: keep_warm, ttl: 15m}}
    processes: {{commands: [llama-server]}}
"""
)


@pytest.fixture(scope="module")
def router(
    llama_server_binary: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LlamaServer]:
    """The real router over three tiny models, at most two loaded at once."""
    models = tmp_path_factory.mktemp("models")
    write_models_dir(models, MODELS)
    with server_starter(
        "real", [str(llama_server_binary)], tmp_path_factory.mktemp("router")
    ) as start:
        yield start(["--models-dir", str(models), "--models-max", "2"])


@attrs.define
class Gated:
    gate: Gate
    url: str
    control: str
    events: list[Event]


@contextlib.asynccontextmanager
async def gate_before(
    upstream: str, tmp_path: Path, library: Path, *, extra: str = ""
) -> AsyncIterator[Gated]:
    """The gate, with a router consumer `llama` at `upstream` and `extra` consumers."""
    listen, control = free_ports(2)
    text = CONFIG.format(control=control, library=library, listen=listen, upstream=upstream)
    text += extra
    config = load_config_text(text, tmp_path / "consumers.yaml")
    async with serving(config) as served:
        gate = served.gate
        events: list[Event] = []
        gate.events.subscribe(events.append, routine=True)
        yield Gated(gate, f"http://127.0.0.1:{listen}", f"http://127.0.0.1:{control}", events)


async def unload_all(router: LlamaServer) -> None:
    async with httpx.AsyncClient(base_url=router.url, timeout=30) as client:
        for name in MODELS:
            await client.post("/models/unload", json={"model": name})
        await wait_statuses(router, {name: "unloaded" for name in MODELS})


async def statuses(router: LlamaServer) -> dict[str, str]:
    async with httpx.AsyncClient(base_url=router.url, timeout=30) as client:
        data = (await client.get("/models")).json()["data"]
    return {row["id"]: row["status"]["value"] for row in data}


async def wait_statuses(router: LlamaServer, wanted: dict[str, str]) -> None:
    async with asyncio.timeout(60):
        while True:
            now = await statuses(router)
            if all(now.get(k) == v for k, v in wanted.items()):
                return
            await asyncio.sleep(0.05)


@pytest.fixture
async def gated(router, tmp_path, sim_host, fakenvml_path) -> AsyncIterator[Gated]:
    await unload_all(router)
    async with gate_before(router.url, tmp_path, fakenvml_path) as gated:
        yield gated


def stable(answer: dict) -> dict:
    """An answer without what differs between two runs of the same request (the second
    finds the first's prompt in its cache: `cached_tokens`)."""
    kept = {k: v for k, v in answer.items() if k not in ("id", "created", "timings")}
    if isinstance(kept.get("usage"), dict):
        kept["usage"] = {k: v for k, v in kept["usage"].items() if k != "prompt_tokens_details"}
    return kept


CHAT = dict(messages=[{"role": "user", "content": "hi"}], max_tokens=6, temperature=0.0, seed=1)


async def test_openai_python_gets_what_it_gets_direct(gated, router):
    direct = openai.AsyncOpenAI(base_url=router.url + "/v1", api_key="x", max_retries=0)
    through = openai.AsyncOpenAI(base_url=gated.url + "/v1", api_key="x", max_retries=0)
    chat_gate = await through.chat.completions.create(model="alpha", **CHAT)
    chat_direct = await direct.chat.completions.create(model="alpha", **CHAT)
    assert stable(chat_gate.model_dump()) == stable(chat_direct.model_dump())
    assert chat_gate.choices[0].message.content

    async def streamed(client: openai.AsyncOpenAI) -> list[str]:
        stream = await client.chat.completions.create(model="alpha", stream=True, **CHAT)
        return [c.choices[0].delta.content or "" for c in [x async for x in stream] if c.choices]

    assert await streamed(through) == await streamed(direct)

    text_gate = await through.completions.create(
        model="alpha", prompt="ab", max_tokens=5, temperature=0
    )
    text_direct = await direct.completions.create(
        model="alpha", prompt="ab", max_tokens=5, temperature=0
    )
    assert stable(text_gate.model_dump()) == stable(text_direct.model_dump())

    for client in (through, direct):
        with pytest.raises(openai.BadRequestError) as caught:
            await client.chat.completions.create(model="nope", **CHAT)
        assert caught.value.status_code == 400
        assert caught.value.body == {
            "code": 400,
            "message": "model 'nope' not found",
            "type": "invalid_request_error",
        }
    # The unknown model was passed unleased: no lease was asked for it.
    assert not [e for e in gated.events if e.model == "nope"]


async def test_embeddings_through_the_gate_equal_direct(gated, router):
    direct = openai.AsyncOpenAI(base_url=router.url + "/v1", api_key="x", max_retries=0)
    through = openai.AsyncOpenAI(base_url=gated.url + "/v1", api_key="x", max_retries=0)
    results = []
    for client in (through, direct):
        try:
            answer = await client.embeddings.create(model="beta", input="hello")
            results.append(("ok", answer.data[0].embedding))
        except openai.APIStatusError as exc:
            results.append((exc.status_code, exc.body))
    assert results[0] == results[1]


async def test_a_load_through_the_gate_is_leased_and_becomes_a_resident(gated, router):
    async with httpx.AsyncClient(base_url=gated.url, timeout=60) as client:
        answer = await client.post(
            "/completion", json={"model": "alpha", "prompt": "a", "n_predict": 2}
        )
    assert answer.status_code == 200
    kinds = [(e.kind, e.model) for e in gated.events]
    assert (EventKind.LEASE_GRANTED, "alpha") in kinds
    grant = next(
        e for e in gated.events if e.kind is EventKind.LEASE_GRANTED and e.model == "alpha"
    )
    assert grant.bytes > 0  # its GGUF header sized it before it ever loaded
    status = await control_status(gated)
    assert [r["model"] for r in status["residents"]] == ["alpha"]
    assert status["leases"] == []  # the request's lease ended with it


async def control_status(gated: Gated) -> dict:
    async with (
        aiohttp.ClientSession() as session,
        session.get(gated.control + "/gate/v1/status") as r,
    ):
        return await r.json()


async def test_eviction_is_a_models_unload(gated, router):
    async with httpx.AsyncClient(base_url=gated.url, timeout=60) as client:
        assert (
            await client.post("/completion", json={"model": "beta", "prompt": "a", "n_predict": 1})
        ).status_code == 200
    assert (await statuses(router))["beta"] == "loaded"
    done = gated.gate.events.next(lambda e: e.kind is EventKind.EVICTION_DONE and e.model == "beta")
    gated.gate.evict(ResidentKey("llama", "beta", ""), who="test")
    await asyncio.wait_for(done, 30)
    assert (await statuses(router))["beta"] == "unloaded"
    status = await control_status(gated)
    assert status["residents"] == []


ROUTER_EVICTS = ("models_max limit reached, removing LRU", "evicting idle LRU name=")
"""What the router logs when it unloads a model of its own accord (server-models.cpp
`unload_lru`, `server_lru_sched::tick`)."""


@pytest.mark.parametrize("route", ["/completion", "/models/load"])
async def test_at_models_max_the_gate_makes_the_room_and_the_router_evicts_nothing(
    gated, router, route
):
    before = router.log().count(ROUTER_EVICTS[0]) + router.log().count(ROUTER_EVICTS[1])
    async with httpx.AsyncClient(base_url=gated.url, timeout=60) as client:
        for name in ("alpha", "beta", "alpha"):
            reply = await client.post(
                "/completion", json={"model": name, "prompt": "a", "n_predict": 1}
            )
            assert reply.status_code == 200
        body = {"model": "gamma", "prompt": "a", "n_predict": 1}
        reply = await client.post(
            route, json=body if route == "/completion" else {"model": "gamma"}
        )
        assert reply.status_code == 200, reply.text
    # The gate evicted beta, its least recently used, before gamma went up: the router
    # found a free slot.
    await wait_statuses(router, {"alpha": "loaded", "beta": "unloaded", "gamma": "loaded"})
    evicted = [e.model for e in gated.events if e.kind is EventKind.EVICTION_STARTED]
    assert evicted == ["beta"]
    after = router.log().count(ROUTER_EVICTS[0]) + router.log().count(ROUTER_EVICTS[1])
    assert after == before, "the router unloaded a model of its own accord"
    async with asyncio.timeout(10):
        while True:
            status = await control_status(gated)
            if sorted(r["model"] for r in status["residents"]) == ["alpha", "gamma"]:
                break
            await asyncio.sleep(0.05)


async def test_a_models_load_of_a_model_the_router_unloaded_itself_is_leased(
    gated, router, monkeypatch
):
    # The router unloads beta behind the gate's back (as its own --models-max LRU did);
    # the gate's last listing, still fresh, calls it loaded. Its /models/load is leased all
    # the same: the books decide, not a cached listing.
    monkeypatch.setattr(llama_router, "CATALOG_TTL", 3600.0)
    reading = gated.gate.links["llama"].runtime.reading
    assert isinstance(reading, llama_router.RouterReading)
    state = reading.state
    async with httpx.AsyncClient(base_url=gated.url, timeout=60) as client:
        reply = await client.post(
            "/completion", json={"model": "beta", "prompt": "a", "n_predict": 1}
        )
        assert reply.status_code == 200
        async with aiohttp.ClientSession() as session:
            await state.refresh(session, time.monotonic())
        assert state.catalog.resolve("beta").running
        async with httpx.AsyncClient(base_url=router.url, timeout=30) as direct:
            assert (await direct.post("/models/unload", json={"model": "beta"})).status_code == 200
        await wait_statuses(router, {"beta": "unloaded"})
        granted = len([e for e in gated.events if e.kind is EventKind.LEASE_GRANTED])
        reply = await client.post("/models/load", json={"model": "beta"})
    assert reply.status_code == 200
    grants = [e for e in gated.events if e.kind is EventKind.LEASE_GRANTED][granted:]
    assert [e.model for e in grants] == ["beta"]
    await wait_statuses(router, {"beta": "loaded"})


async def test_models_load_holds_a_lease_until_the_model_is_up(gated, router):
    async with httpx.AsyncClient(base_url=gated.url, timeout=60) as client:
        reply = await client.post("/models/load", json={"model": "gamma"})
        assert reply.status_code == 200
        assert reply.json() == {"success": True}
        again = await client.post("/models/load", json={"model": "gamma"})
    await wait_statuses(router, {"gamma": "loaded"})
    assert again.status_code == 400
    assert again.json()["error"]["message"] == "model is already running"
    assert any(e.kind is EventKind.LEASE_GRANTED and e.model == "gamma" for e in gated.events)
    # The router's listing, not NVML (a CPU build shows nothing there), ends the lease.
    async with asyncio.timeout(10):
        while not any(
            e.kind is EventKind.LEASE_RELEASED and e.model == "gamma" for e in gated.events
        ):
            await asyncio.sleep(0.05)
    released = next(
        e for e in gated.events if e.kind is EventKind.LEASE_RELEASED and e.model == "gamma"
    )
    assert released.reason == "resident"
    status = await control_status(gated)
    assert [r["model"] for r in status["residents"]] == ["gamma"]
    assert status["leases"] == []


async def streamed_raw(url: str, *, wait: float) -> tuple[bytes, bool]:
    """A streamed `/completion` sent raw: every byte answered, and whether the server
    closed the connection after it (`wait` seconds with nothing more: not closed)."""
    body = json.dumps(
        {"model": "alpha", "prompt": "ab", "n_predict": 3, "stream": True, "temperature": 0}
    ).encode()
    host, _, port = url.removeprefix("http://").rpartition(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(
        b"POST /completion HTTP/1.1\r\nHost: h\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n\r\n%b" % (len(body), body)
    )
    data = b""
    try:
        while chunk := await asyncio.wait_for(reader.read(65536), wait):
            data += chunk
        return data, True
    except TimeoutError:
        return data, False
    finally:
        writer.close()


def head_fields(data: bytes) -> list[bytes]:
    """The status line and header lines, less the gate's own."""
    lines = data.partition(b"\r\n\r\n")[0].split(b"\r\n")
    return [line for line in lines if not line.lower().startswith(b"x-gpugate-")]


async def test_a_stream_keeps_its_head_and_the_gate_keeps_the_connection(gated, router):
    """A streamed answer has the head direct has, line for line (the router's copy of its
    child's `Connection: close` before cpp-httplib's own line included). llama-server ends
    the connection after it, though its head says Keep-Alive (runtimes/keepalive.py
    `LLAMA_HTTPLIB`); the gate keeps it, as the head says: a client that takes the head at
    its word and sends again on it is served (docs/reliability.md)."""
    direct, direct_closed = await streamed_raw(router.url, wait=30)
    through, through_closed = await streamed_raw(gated.url, wait=3)
    assert direct_closed and not through_closed
    assert head_fields(through) == head_fields(direct)
    assert b"\r\nKeep-Alive: timeout=5, max=100\r\n" in direct
    assert through.endswith(b"\r\n0\r\n\r\n") and direct.endswith(b"\r\n0\r\n\r\n")
