"""Capacity for routers through a real gate on a fake clock: `GET /gate/v1/capacity`
and the agent-check responder, answering from the same numbers."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from pathlib import Path

import attrs
import pytest
from aiohttp.test_utils import TestClient, TestServer

from gpugate.config.loader import ConfigError
from gpugate.config.model import Address
from gpugate.control.agent import AgentResponder
from gpugate.control.app import control_app
from gpugate.control.capacity import FLOOR
from gpugate.control.metrics import GateMetrics
from gpugate.core.classes import PriorityClass, ResidencyPolicy
from gpugate.core.residents import ResidentKey
from gpugate.core.tickets import Demand
from gpugate.core.units import GiB, MiB
from gpugate.gate.gate import Gate
from gpugate.gpu.sampler import Sampler
from gpugate.runtimes.sections import load_config_text
from tests.control.operated import Clock
from tests.gate.fakes import FakeAttributor, FakeGpu, FakeUpstream
from tests.ports import free_port, free_ports
from tests.serving import serving

STALE_AFTER = 3600.0
CONFIG = """\
gate:
  control: 127.0.0.1:1
  agent_check: 127.0.0.1:{agent}
budget:
  reserve: 1GiB
  reserve_max: 1GiB
  sample_interval: 10m
  stale_after: 1h
consumers:
  ollama:
    runtime: ollama
    listen: 127.0.0.1:11
    upstream: {upstream}
    class: interactive
    residency: {{policy: keep_warm, ttl: 15m}}
    processes: {{commands: [llama-server]}}
    models:
      gemma3:12b: {{envelope: 7796MiB}}
      bge-m3: {{class: background, envelope: 2012MiB}}
      llama3.2:3b: {{class: benchmark, envelope: 3200MiB}}
      qwen2.5:7b: {{envelope: 5700MiB}}
"""
# 16 GiB card, 434 MiB driver reserved, 1 GiB reserve: 14,926 MiB schedulable empty.
EMPTY = 16 * GiB - 434 * MiB - 1 * GiB


@attrs.define
class Capacity:
    gate: Gate
    clock: Clock
    gpu: FakeGpu
    upstream: FakeUpstream
    client: TestClient
    agent: AgentResponder
    pids: int = 1

    async def get(self, query: str = "") -> tuple[int, dict]:
        async with self.client.get("/gate/v1/capacity" + query) as resp:
            return resp.status, await resp.json()

    async def model(self, model: str, query: str = "") -> dict:
        status, document = await self.get(f"?model={model}{query}")
        assert status == 200, document
        (row,) = document["models"]
        return row

    async def ask(self, payload: bytes | None, *, close: bool = False) -> str:
        """One agent check: connect, send `payload` (None: nothing), read the answer."""
        host, port = self.agent.bound
        reader, writer = await asyncio.open_connection(host, port)
        try:
            if payload:
                writer.write(payload)
                await writer.drain()
            if close:
                writer.write_eof()
            return (await asyncio.wait_for(reader.read(), 5)).decode()
        finally:
            writer.close()

    async def load(self, model: str, nbytes: int, priority: PriorityClass) -> None:
        """A request loads `model` and ends; NVML and the runtime's listing show it."""
        demand = Demand(
            key=ResidentKey("ollama", model),
            gpu=0,
            envelope=nbytes,
            priority=priority,
            resident_priority=priority,
            policy=ResidencyPolicy.KEEP_WARM,
            idle_ttl=900.0,
        )
        lease = await self.gate.leases.acquire(demand)
        self.upstream.loaded[model] = nbytes
        self.gpu.held[self.pids] = nbytes
        self.pids += 1
        self.gate.leases.loaded(lease)
        self.gate.leases.release(lease)
        await self.sample()

    async def sample(self) -> None:
        self.gate.observe(await self.gate.sampler.sample())

    def external(self, nbytes: int) -> None:
        self.gpu.held[5000] = nbytes


@contextlib.asynccontextmanager
async def capacity_gate(tmp_path: Path, **agent: float) -> AsyncIterator[Capacity]:
    upstream = FakeUpstream()
    async with TestServer(upstream.app()) as server:
        url = str(server.make_url("")).rstrip("/")
        text = CONFIG.format(upstream=url, agent=free_port())
        config = load_config_text(text, tmp_path / "consumers.yaml")
        clock = Clock()
        gpu = FakeGpu()
        sampler = Sampler(gpu, FakeAttributor(), clock=clock)
        # One listing at the start and no more: the test says what the runtime holds.
        gate = Gate(config, sampler, clock=clock, listing_interval=3600.0)
        await gate.start()
        assert config.gate.agent_check is not None
        responder = AgentResponder(gate, config.gate.agent_check, **agent)  # type: ignore[arg-type]
        await responder.start()
        try:
            app = control_app(gate, GateMetrics(gate))
            async with TestClient(TestServer(app)) as client:
                capacity = Capacity(gate, clock, gpu, upstream, client, responder)
                await capacity.sample()
                yield capacity
        finally:
            await responder.close()
            await gate.close()


@pytest.fixture
async def cap(tmp_path):
    async with capacity_gate(tmp_path) as capacity:
        yield capacity


# -- the route -------------------------------------------------------------------------------


async def test_an_empty_card_fits_every_model_and_says_so_per_gpu(cap):
    status, document = await cap.get()
    assert status == 200
    assert document["ok"] is True and document["failed"] == []
    assert document["floor"] == FLOOR
    (gpu,) = document["gpus"]
    assert gpu["gpu"] == 0 and gpu["total"] == 16 * GiB and gpu["schedulable"] == EMPTY
    assert (gpu["paused"], gpu["queue_depth"], gpu["residents"]) == (False, 0, [])
    assert document["agent"] == {
        "line": f"up ready {round(100 * EMPTY / (16 * GiB))}%",
        "state": "up",
        "weight": round(100 * EMPTY / (16 * GiB)),
        "reason": "schedulable share of the memory",
    }
    rows = {row["model"]: row for row in document["models"]}
    assert set(rows) == {"gemma3:12b", "bge-m3:latest", "llama3.2:3b", "qwen2.5:7b"}
    for row in rows.values():
        assert row["verdict"] == "fits" and row["plan"] == "grant"
        assert row["needed"] == row["envelope"] and row["envelope_source"] == "configured"
        assert row["available"] == EMPTY and row["blocked"] is None
        assert row["agent"]["state"] == "up" and 1 <= row["agent"]["weight"] <= 99
    assert rows["bge-m3:latest"]["class"] == "background"
    assert rows["qwen2.5:7b"]["class"] == "interactive"


async def test_each_verdict_through_the_route(cap):
    await cap.load("gemma3:12b", 7796 * MiB, PriorityClass.INTERACTIVE)
    await cap.load("bge-m3:latest", 2012 * MiB, PriorityClass.BACKGROUND)
    left = EMPTY - (7796 + 2012) * MiB

    gemma = await cap.model("gemma3:12b")
    assert (gemma["verdict"], gemma["needed"]) == ("resident", 0)
    assert gemma["agent"]["line"] == "up ready 100%"

    llama = await cap.model("llama3.2:3b")
    assert (llama["verdict"], llama["needed"], llama["available"]) == (
        "fits",
        3200 * MiB,
        left,
    )
    assert llama["agent"]["line"] == f"up ready {round(100 * (left - 3200 * MiB) / (16 * GiB))}%"

    # qwen (5,700 MiB) does not fit the 5,118 MiB left; the idle background bge-m3 goes.
    qwen = await cap.model("qwen2.5:7b")
    assert qwen["verdict"] == "after_eviction" and qwen["plan"] == "evict"
    assert qwen["victims"] == [{"consumer": "ollama", "model": "bge-m3:latest", "options": ""}]
    assert qwen["freed"] == 2012 * MiB and qwen["agent"]["line"] == "drain 0%"

    # Asked as a background request, it may not take bge-m3 before the idle grace, nor
    # gemma3 at all: it would wait.
    waits = await cap.model("qwen2.5:7b", "&class=background")
    assert (waits["verdict"], waits["plan"], waits["class"]) == ("no_room", "wait", "background")
    assert waits["agent"] == {
        "line": "drain 0%",
        "state": "drain",
        "weight": 0,
        "reason": "no_room: waiting for memory to be released",
    }

    unknown = await cap.model("mystery:1b")
    assert (unknown["verdict"], unknown["envelope"], unknown["envelope_source"]) == (
        "unknown",
        None,
        None,
    )
    assert unknown["agent"]["state"] == "up"

    # Names resolve as the runtime's do.
    assert (await cap.model("bge-m3"))["model"] == "bge-m3:latest"

    _, document = await cap.get()
    residents = {r["model"]: r for r in document["gpus"][0]["residents"]}
    assert set(residents) == {"gemma3:12b", "bge-m3:latest"}
    assert residents["bge-m3:latest"]["state"] == "resident"
    assert residents["bge-m3:latest"]["class"] == "background"
    assert document["gpus"][0]["schedulable"] == left


async def test_no_room_when_external_memory_fills_the_card_and_the_host_drains(cap):
    cap.external(EMPTY - 100 * MiB)
    await cap.sample()
    qwen = await cap.model("qwen2.5:7b")
    assert (qwen["verdict"], qwen["plan"]) == ("no_room", "fail")
    assert qwen["agent"]["line"] == "drain 0%"
    _, document = await cap.get()
    assert document["agent"]["state"] == "drain"
    assert document["agent"]["reason"] == f"no GPU has {FLOOR // MiB} MiB schedulable"
    assert await cap.ask(b"\n") == "drain 0%\n"


async def test_operator_marks_block_and_drain(cap):
    await cap.load("gemma3:12b", 7796 * MiB, PriorityClass.INTERACTIVE)
    cap.gate.apply(cap.gate.core.operator.pause(0, cap.clock.now))
    row = await cap.model("gemma3:12b")
    assert (row["verdict"], row["blocked"]) == ("no_room", "paused")
    _, document = await cap.get()
    assert document["gpus"][0]["paused"] is True
    assert document["agent"]["line"] == "drain 0%"
    assert document["agent"]["reason"] == "every GPU is paused"
    assert await cap.ask(b"\n") == "drain 0%\n"
    assert await cap.ask(b"gemma3:12b\n") == "drain 0%\n"
    cap.gate.apply(cap.gate.core.operator.resume(0, cap.clock.now))
    cap.gate.apply(cap.gate.core.operator.drain("ollama", cap.clock.now))
    row = await cap.model("qwen2.5:7b")
    assert (row["verdict"], row["blocked"]) == ("no_room", "draining")
    assert row["agent"]["reason"] == "no_room: draining"
    assert (await cap.ask(b"\n")).startswith("up ready ")


async def test_stale_samples_are_maint_everywhere(cap):
    await cap.load("gemma3:12b", 7796 * MiB, PriorityClass.INTERACTIVE)
    cap.clock.now += STALE_AFTER + 1
    status, document = await cap.get()
    assert status == 200 and document["ok"] is False and "nvml" in document["failed"]
    assert document["agent"]["line"] == "maint 0%"
    assert document["agent"]["reason"].startswith("unhealthy: ")
    rows = {row["model"]: row for row in document["models"]}
    # The resident is still served (no sample needed); a load is refused as stale.
    assert rows["gemma3:12b"]["verdict"] == "resident"
    assert (rows["qwen2.5:7b"]["verdict"], rows["qwen2.5:7b"]["blocked"]) == (
        "no_room",
        "stale",
    )
    assert {row["agent"]["line"] for row in rows.values()} == {"maint 0%"}
    assert await cap.ask(b"\n") == "maint 0%\n"
    assert await cap.ask(b"gemma3:12b\n") == "maint 0%\n"
    await cap.sample()
    assert (await cap.ask(b"gemma3:12b\n")) == "up ready 100%\n"


@pytest.mark.parametrize(
    ("query", "message"),
    [
        ("?consumer=nobody", "unknown consumer 'nobody' (fronted: ollama)"),
        ("?class=urgent", "unknown priority class 'urgent'"),
        ("?model=%20", "model is empty"),
    ],
)
async def test_unknown_questions_are_400_in_the_api_shape(cap, query, message):
    status, document = await cap.get(query)
    assert status == 400
    assert document["error"]["class"] == "BAD_REQUEST"
    assert document["error"]["message"].startswith(message)


async def test_consumer_and_class_narrow_the_question(cap):
    status, document = await cap.get("?consumer=ollama&class=production")
    assert status == 200
    assert len(document["models"]) == 4
    assert {row["class"] for row in document["models"]} == {"production"}


# -- the agent ------------------------------------------------------------------------------


async def test_the_agent_answers_what_the_route_says(cap):
    await cap.load("gemma3:12b", 7796 * MiB, PriorityClass.INTERACTIVE)
    await cap.load("bge-m3:latest", 2012 * MiB, PriorityClass.BACKGROUND)
    _, document = await cap.get()
    assert await cap.ask(b"\n") == document["agent"]["line"] + "\n"
    for row in document["models"]:
        assert await cap.ask(row["model"].encode() + b"\n") == row["agent"]["line"] + "\n"
    assert await cap.ask(b"gemma3:12b\n") == "up ready 100%\n"
    assert await cap.ask(b"qwen2.5:7b\r\n") == "drain 0%\n"
    # The same question in key=value form, with a class, in any order, tab-separated.
    production = await cap.model("qwen2.5:7b", "&class=production")
    assert production["verdict"] == "after_eviction"
    line = b"class=production\tconsumer=ollama model=qwen2.5:7b\n"
    assert await cap.ask(line) == production["agent"]["line"] + "\n"
    llama = await cap.model("llama3.2:3b")
    assert (await cap.ask(b"llama3.2:3b\n")) == llama["agent"]["line"] + "\n"
    assert llama["agent"]["weight"] < 100


async def test_silence_is_a_question_about_the_host(tmp_path):
    # A silence far longer than a busy machine's pauses tells "waited it out" from "at once".
    async with capacity_gate(tmp_path, silence=2.0, read_timeout=4.0) as cap:
        started = time.monotonic()
        answer = await cap.ask(None)
        waited = time.monotonic() - started
        assert answer == (await cap.get())[1]["agent"]["line"] + "\n"
        assert waited >= 2.0
        # An empty line is answered at once, not after the silence.
        started = time.monotonic()
        assert await cap.ask(b"\n") == answer
        assert time.monotonic() - started < 2.0


@pytest.mark.parametrize(
    "payload",
    [
        b"\x00\xff\xfe garbage \x01\n",
        b"\xc3\xa9t\xc3\xa9\n",
        b"x" * 5000,
        b"qwen2.5:7b llama3.2:3b\n",
        b"consumer=nobody qwen2.5:7b\n",
        b"class=urgent qwen2.5:7b\n",
        b"color=blue\n",
        b"GET / HTTP/1.1\r\nHost: x\r\n\r\n",
        b"\x1b[31mred\n",
    ],
)
async def test_garbage_is_answered_for_the_host(cap, payload):
    host = (await cap.get())[1]["agent"]["line"] + "\n"
    assert await cap.ask(payload) == host
    # The responder answers the next question as before.
    assert await cap.ask(b"gemma3:12b\n") == (await cap.model("gemma3:12b"))["agent"]["line"] + "\n"


async def test_a_peer_that_leaves_early_or_trickles_does_not_hold_the_responder(tmp_path):
    async with capacity_gate(tmp_path, read_timeout=0.6, silence=0.3) as cap:
        host, port = cap.agent.bound
        # Connects and leaves at once, with and without a half-sent question.
        for payload in (b"", b"qwen2"):
            _, writer = await asyncio.open_connection(host, port)
            if payload:
                writer.write(payload)
            writer.transport.abort()
        # A byte every 0.2 s never ends its line: it is answered when the read times out.
        reader, writer = await asyncio.open_connection(host, port)
        line = b"qwen2.5:7b-and-on-and-on"
        sent = 0

        async def trickle() -> None:
            nonlocal sent
            with contextlib.suppress(ConnectionError):
                for byte in line:
                    writer.write(bytes([byte]))
                    await writer.drain()
                    sent += 1
                    await asyncio.sleep(0.2)

        sending = asyncio.create_task(trickle())
        answer = await asyncio.wait_for(reader.read(), 30)
        # Answered while the line was still trickling in: its read timed out.
        assert answer.endswith(b"\n") and sent < len(line), (answer, sent)
        sending.cancel()
        writer.close()
        # Half a name after the timeout is a model nobody knows: answered like the host's.
        assert answer.decode().startswith("up ready ")
        assert await cap.ask(b"\n") == (await cap.get())[1]["agent"]["line"] + "\n"
        assert cap.agent.active == 0


async def test_connections_beyond_the_cap_are_closed_unanswered(tmp_path):
    async with capacity_gate(tmp_path, max_connections=2, silence=1.0, read_timeout=1.0) as cap:
        host, port = cap.agent.bound
        held = [await asyncio.open_connection(host, port) for _ in range(2)]
        async with asyncio.timeout(30):
            while cap.agent.active < 2:  # the responder takes each as its loop gets to it
                await asyncio.sleep(0.01)
        assert cap.agent.active == 2
        reader, writer = await asyncio.open_connection(host, port)
        assert await asyncio.wait_for(reader.read(), 5) == b""
        writer.close()
        assert cap.agent.refused == 1
        # The two held ones are answered once their silence is over, and then a new one is.
        for held_reader, held_writer in held:
            assert (await asyncio.wait_for(held_reader.read(), 5)).startswith(b"up ready ")
            held_writer.close()
        assert await cap.ask(b"\n") == (await cap.get())[1]["agent"]["line"] + "\n"


async def test_a_burst_of_checks_is_answered_in_full(cap):
    answers = await asyncio.gather(*(cap.ask(b"qwen2.5:7b\n") for _ in range(40)))
    expected = (await cap.model("qwen2.5:7b"))["agent"]["line"] + "\n"
    assert answers == [expected] * 40
    assert cap.agent.refused == 0


# -- configuration ---------------------------------------------------------------------------


def test_agent_check_is_an_address_or_null(tmp_path):
    base = "gate:\n  control: 127.0.0.1:9411\n"
    config = load_config_text(base + "  agent_check: 0.0.0.0:9412\n", tmp_path / "c.yaml")
    assert config.gate.agent_check == Address("0.0.0.0", 9412)
    config = load_config_text(base + "  agent_check: null\n", tmp_path / "c.yaml")
    assert config.gate.agent_check is None
    assert load_config_text(base, tmp_path / "c.yaml").gate.agent_check is None
    with pytest.raises(ConfigError) as raised:
        load_config_text(base + "  agent_check: 127.0.0.1:9411\n", tmp_path / "c.yaml")
    assert "gate.agent_check" in str(raised.value) and "already used" in str(raised.value)
    with pytest.raises(ConfigError) as raised:
        load_config_text(base + "  agent_check: [1, 2]\n", tmp_path / "c.yaml")
    assert "gate.agent_check" in str(raised.value)


async def test_serve_starts_the_responder_beside_the_control_listener(tmp_path):
    """`gpugate serve` with `gate.agent_check` answers on it, and says where when ready."""
    listen, control = free_ports(2)
    upstream = FakeUpstream()
    async with TestServer(upstream.app()) as server:
        url = str(server.make_url("")).rstrip("/")
        text = CONFIG.format(upstream=url, agent=free_port())
        text = text.replace("127.0.0.1:1\n", f"127.0.0.1:{control}\n")
        text = text.replace("listen: 127.0.0.1:11", f"listen: 127.0.0.1:{listen}")
        config = load_config_text(text, tmp_path / "consumers.yaml")

        def make_gate(cfg):
            return Gate(cfg, Sampler(FakeGpu(), FakeAttributor()))

        async with serving(config, gate_factory=make_gate) as served:
            (line,) = [x for x in served.lines if "agent-check on" in x]
            where = line.split(" on ")[1].split(" ")[0]
            host, _, port = where.rpartition(":")
            reader, writer = await asyncio.open_connection(host, int(port))
            writer.write(b"qwen2.5:7b\n")
            answer = await asyncio.wait_for(reader.read(), 5)
            writer.close()
            assert answer.startswith(b"up ready ") and answer.endswith(b"%\n")
        # Closed with the gate.
        with pytest.raises(OSError):
            await asyncio.open_connection(host, int(port))
