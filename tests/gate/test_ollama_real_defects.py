"""What a real Ollama behind the gate showed: a client's disconnect, unloads, sizing."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import json
import socket
import struct
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import TypeVar

import attrs
import ollama as ollama_client
import pytest

from gpugate.core.effects import Event, EventKind
from gpugate.sim.device import SimulatedGpuHost
from gpugate.sim.ollama.server import SimOllama
from gpugate.sim.ollama.state import SimState
from gpugate.sim.scenario import OllamaSpec
from tests.gate.harness import DEFAULT_MODELS_YAML, MODELS, running_stack

T = TypeVar("T")
TOKENS_PER_SECOND = 50.0


@pytest.fixture
async def stack_plain(tmp_path, sim_host, fakenvml_path):
    async with running_stack(tmp_path, sim_host, fakenvml_path) as stack:
        yield stack


class ThreadedOllama:
    """A simulated Ollama on its own event loop in a thread: it keeps answering while the
    gate's loop is held, so a test can line up what the gate finds on its next turn."""

    def __init__(self, spec: OllamaSpec, host: SimulatedGpuHost) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._spec = spec
        self._host = host
        self.sim: SimOllama | None = None

    def _run(self, make: Callable[[], Awaitable[T]]) -> concurrent.futures.Future[T]:
        async def call() -> T:
            return await make()

        return asyncio.run_coroutine_threadsafe(call(), self._loop)

    async def start(self) -> str:
        self._thread.start()

        async def begin() -> str:
            self.sim = SimOllama(self._spec, self._host)
            return await self.sim.start()

        return await asyncio.wrap_future(self._run(begin))

    async def wait_until(self, predicate: Callable[[SimState], bool]) -> SimState:
        assert self.sim is not None
        sim = self.sim
        return await asyncio.wrap_future(self._run(lambda: sim.wait_until(predicate, 5)))

    async def close(self) -> None:
        if self.sim is not None:
            await asyncio.wrap_future(self._run(self.sim.close))
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)
        self._loop.close()


@contextlib.contextmanager
def failures_seen(stack) -> Iterator[list[Event]]:
    seen: list[Event] = []

    def keep(event: Event) -> None:
        if event.kind is EventKind.FAILURE:
            seen.append(event)

    stack.gate.events.subscribe(keep)
    try:
        yield seen
    finally:
        stack.gate.events.unsubscribe(keep)


async def _stream(url: str, model: str) -> tuple[socket.socket, int]:
    """A raw client's streaming generate with `Connection: close`, its head and first
    chunk read. Returns the socket and the lease the answer named."""
    loop = asyncio.get_running_loop()
    host, port = url.removeprefix("http://").rsplit(":", 1)
    sock = socket.socket()
    sock.setblocking(False)
    await loop.sock_connect(sock, (host, int(port)))
    body = json.dumps({"model": model, "prompt": "tell me a long story"}).encode()
    await loop.sock_sendall(
        sock,
        b"POST /api/generate HTTP/1.1\r\nHost: %b\r\nContent-Type: application/json\r\n"
        b"Connection: close\r\nContent-Length: %d\r\n\r\n%b"
        % (f"{host}:{port}".encode(), len(body), body),
    )
    received = b""
    while b'"response"' not in received:
        part = await asyncio.wait_for(loop.sock_recv(sock, 65536), 10)
        assert part, received
        received += part
    head = received.split(b"\r\n\r\n", 1)[0]
    assert head.startswith(b"HTTP/1.1 200"), head
    lease = next(
        int(line.split(b":", 1)[1])
        for line in head.split(b"\r\n")
        if line.lower().startswith(b"x-gpugate-lease:")
    )
    return sock, lease


def _reset(sock: socket.socket) -> None:
    """Close with SO_LINGER 0: the peer gets a reset at once, not a FIN."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()


async def test_a_client_resetting_mid_stream_is_not_a_runtime_crash(
    tmp_path, sim_host, fakenvml_path
):
    slow = tuple(attrs.evolve(m, tokens_per_second=TOKENS_PER_SECOND) for m in MODELS)
    ollama = ThreadedOllama(
        OllamaSpec(listen="127.0.0.1:0", keep_alive="5m", models=slow), sim_host
    )
    url = await ollama.start()
    try:
        async with running_stack(tmp_path, sim_host, fakenvml_path, upstream=url) as stack:
            with failures_seen(stack) as failures:
                released = stack.next_event(EventKind.LEASE_RELEASED, model="llama3.2:3b")
                sock, lease = await _stream(stack.gate_url, "llama3.2:3b")
                # The gate's loop is held while the runtime writes its next tokens, then the
                # client resets: the gate's next turn finds the upstream's chunk ready before
                # the client's reset, and writes it to a transport already closing. Real
                # clients hit this whenever the two arrive together.
                time.sleep(5 / TOKENS_PER_SECOND)
                _reset(sock)
                time.sleep(0.01)
                event = await asyncio.wait_for(released, 5)
            assert event.lease == lease
            assert event.reason == "done"
            assert [e.detail for e in failures] == []
            assert stack.gate.core.lease(lease) is None
            assert stack.gate.core.leases() == []
            state = await ollama.wait_until(lambda s: s.counters.generations_cancelled == 1)
            runner = state.runner("llama3.2:3b")
            assert runner is not None and runner.refcount == 0
    finally:
        await ollama.close()


SHORT_TTL = DEFAULT_MODELS_YAML.replace(
    "llama3.2:3b: {envelope: 3200MiB}",
    "llama3.2:3b: {envelope: 3200MiB, residency: {policy: keep_warm, ttl: 1s}}",
)


async def test_a_model_the_gate_unloads_is_not_adopted_again_while_ollama_still_lists_it(
    tmp_path, sim_host, fakenvml_path
):
    async with running_stack(tmp_path, sim_host, fakenvml_path, models_yaml=SHORT_TTL) as stack:
        # Ollama lists a runner until it has reaped it, after its memory is back.
        stack.sim.scheduler.faults.reap_seconds = 0.5
        kinds = (EventKind.OUT_OF_BAND_RESIDENT, EventKind.RESIDENT_GONE, EventKind.EVICTION_DONE)
        seen: list[Event] = []
        stack.gate.events.subscribe(lambda e: seen.append(e) if e.kind in kinds else None)
        adopted = stack.next_event(EventKind.OUT_OF_BAND_RESIDENT, model="llama3.2:3b")
        unloaded = stack.next_event(EventKind.EVICTION_DONE, model="llama3.2:3b")
        # Loaded straight at Ollama, behind the gate's back.
        await ollama_client.AsyncClient(host=stack.sim_url).generate(
            model="llama3.2:3b", prompt="x", keep_alive="1h", options={"num_predict": 1}
        )
        stack.gate.want_reconcile("ollama")
        await asyncio.wait_for(adopted, 5)
        done = await asyncio.wait_for(unloaded, 10)  # its ttl: the gate unloads it
        assert done.reason == "ttl" and done.detail.startswith("reclaimed"), done
        # What Ollama lists now, and once its runner is gone, is folded in at once.
        link = stack.gate.links["ollama"]
        await stack.gate.signals.reconcile(link)
        await stack.sim.wait_until(lambda s: s.runner("llama3.2:3b") is None)
        await stack.gate.signals.reconcile(link)
        assert [(e.kind, e.model) for e in seen] == [
            (EventKind.OUT_OF_BAND_RESIDENT, "llama3.2:3b"),
            (EventKind.EVICTION_DONE, "llama3.2:3b"),
        ]
        assert [r.key.model for r in stack.gate.core.residents(0)] == []
        assert "llama3.2:3b" not in [m["name"] for m in await stack.ps()]


async def test_with_ollama_down_a_load_that_must_replace_a_variant_says_it_is_not_answering(
    stack_plain,
):
    stack = stack_plain
    client = ollama_client.AsyncClient(host=stack.gate_url)
    await client.generate(
        model="llama3.2:3b", prompt="x", options={"num_predict": 1, "num_ctx": 2048}
    )
    await stack.sim.close()  # Ollama's process is down; the books still hold its model
    with pytest.raises(ollama_client.ResponseError) as raised:
        await client.generate(
            model="llama3.2:3b", prompt="x", options={"num_predict": 1, "num_ctx": 4096}
        )
    error = raised.value
    assert error.status_code == 502
    message = error.error
    assert message.startswith("RUNTIME_CRASH: "), message
    assert "not answering" in message, message
    assert "schedulable" not in message and "evictable" not in message, message
