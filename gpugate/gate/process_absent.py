"""What a request meets when a process runtime is not up: a start under way, or a process
the gate keeps stopped.

* **A start under way** (the gate's own: at its start for an `always_warm` runtime, on a
  request's demand, again after a crash): every request that arrives meanwhile waits for
  it, within the consumer's `control.start_timeout`, whether it needs the process or not.
  whisper-server binds its port only once its model is loaded, so before that a request
  would meet a refused connection, which is no crash.
* **Stopped on purpose** (evicted, its ttl ran out, not started yet): the process refuses
  connections, but the service is there: a request that needs the process starts it. So
  its health route is answered by the gate in the runtime's place, as the runtime answers
  it once up (`Lifecycle.up_health`), marked `X-GPUGate-Process: stopped`; a monitor or a
  load balancer neither takes it out of rotation nor starts a model by asking. Any other
  request starts it (only the runtime can answer it).
* **Stopped after a failure** (its last start failed, or it ended on its own): its health
  route answers 503 START_BACKOFF, with the time left before the next start.

None of these is a RUNTIME_CRASH: the gate stopped the process, or reported its end once.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator

import attrs

from gpugate.core.failures import Failure
from gpugate.core.lifecycle import Life, LifeState
from gpugate.gate.link import Link
from gpugate.runtimes.base import ApiFamily, failure_reply
from gpugate.runtimes.replies import ErrorReply

PROCESS_HEADER = "X-GPUGate-Process"
"""On an answer the gate gives in a stopped runtime's place: `stopped`."""
HEALTH_METHODS = frozenset({"GET", "HEAD"})
DEFAULT_START_TIMEOUT = 60.0
"""For a consumer without `control:` (its config default is the same)."""


def start_timeout(link: Link) -> float:
    control = link.consumer.control
    return control.start_timeout if control is not None else DEFAULT_START_TIMEOUT


class StartsUnderWay:
    """The process starts the gate has under way, by consumer, for requests to wait on."""

    def __init__(self) -> None:
        self._count: dict[str, int] = {}
        self._over: dict[str, asyncio.Event] = {}

    @contextlib.contextmanager
    def running(self, consumer: str) -> Iterator[None]:
        """A start of `consumer` is under way for as long as this block runs (nested
        blocks count as one)."""
        self._count[consumer] = self._count.get(consumer, 0) + 1
        over = self._over.get(consumer)
        if over is None or over.is_set():
            over = self._over[consumer] = asyncio.Event()
        try:
            yield
        finally:
            self._count[consumer] -= 1
            if not self._count[consumer]:
                del self._count[consumer]
                over.set()

    def under_way(self, consumer: str) -> bool:
        return consumer in self._count

    async def wait(self, consumer: str, timeout: float) -> bool:
        """Wait until no start of `consumer` is under way; False when one still is after
        `timeout` seconds."""
        over = self._over.get(consumer)
        if consumer not in self._count or over is None:
            return True
        try:
            async with asyncio.timeout(timeout):
                await over.wait()
        except TimeoutError:
            return False
        return True


def health_route(link: Link, method: str, path: str) -> bool:
    """Whether a request asks the runtime's health route (`control.health`)."""
    control = link.consumer.control
    return control is not None and method in HEALTH_METHODS and path == control.health


def stand_in(link: Link, method: str, failing: Failure | None, api: ApiFamily) -> ErrorReply:
    """The gate's answer to `method` on the health route of a runtime whose process is not
    there: the runtime's own when it is up (`Lifecycle.up_health`), or `failing`
    (START_BACKOFF)."""
    if failing is not None:
        return failure_reply(api, failing)
    lifecycle = link.runtime.lifecycle
    assert lifecycle is not None, "only a process runtime is stood in for"
    reply = lifecycle.up_health(method)
    return attrs.evolve(reply, headers=(*reply.headers, (PROCESS_HEADER, "stopped")))


def not_up(life: Life | None, waited: float, last_failure: str | None, queued: str | None) -> str:
    """Why a process the gate was to start at its own start is not up, in a few words
    (`queued`: the lease its start still waits for, if it does)."""
    if life is not None and life.state is LifeState.STARTING:
        return f"still starting after {waited:g}s"
    if last_failure:
        return last_failure
    if queued:
        return f"its start still waits for a lease of {queued} after {waited:g}s"
    if life is None:
        return "no lifecycle"
    return f"{life.state.value} after {waited:g}s"
