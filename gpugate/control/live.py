"""Server-sent events for the dashboard and for `gpugate events --follow`.

One `LiveFeed` per control app subscribes to the gate's events while a stream is open
and fans them out to the connected streams (with none open, the two events of each
request are never built). Events go out as they happen. Snapshots of the whole state go
out on connect and then whenever a new NVML sample arrived or an event changed the
books, at most once per `min_interval`: a stream is never a snapshot per event, so a
burst of requests costs each viewer a few documents a second, not one per request.

A viewer that reads too slowly loses the oldest events it has not been sent (its
buffer is bounded) and is told how many with a `dropped` event; the gate never waits
on a viewer.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import attrs
from aiohttp import web

from gpugate.core.classes import PriorityClass
from gpugate.core.effects import Event
from gpugate.core.explain import refusal_line
from gpugate.core.failures import FailureClass
from gpugate.gate.events import event_json

if TYPE_CHECKING:
    from gpugate.gate.gate import Gate

MIN_INTERVAL = 0.25
"""The shortest time between two snapshots on one stream."""
KEEPALIVE = 15.0
"""Seconds of silence after which a comment line keeps proxies from closing the stream."""
BUFFER = 1000
"""Events kept for one slow viewer."""


def event_document(event: Event, gate: Gate) -> dict[str, Any]:
    """An event as the control API shows it: the log line's fields and its wall time; a
    failure's reason in one line too (`line`)."""
    document: dict[str, Any] = json.loads(event_json(event))
    document["time"] = round(time.time() - (gate.clock() - event.time), 3)
    if event.priority is not None:
        document["priority"] = event.priority
    if event.failure is not None:
        document["failure"] = event.failure.failure_class.value
        document["line"] = refusal_line(event.failure)
    return document


class BadFilter(ValueError):
    """A query names a class or failure class that does not exist."""


@attrs.frozen
class EventFilter:
    """Which events a follower wants: all of the given fields must match."""

    consumer: str | None = None
    priority: str | None = None
    failure: str | None = None

    @classmethod
    def from_query(cls, query: Any) -> EventFilter:
        """`consumer`, `class` (priority class) and `failure` (failure class) query
        parameters; BadFilter for a class or failure class that does not exist (a filter
        that can match nothing is a typo, not an empty answer)."""
        failure = (query.get("failure") or "").strip().upper() or None
        priority = (query.get("class") or "").strip().lower() or None
        if priority is not None:
            try:
                priority = PriorityClass.parse(priority).label
            except ValueError:
                labels = ", ".join(c.label for c in PriorityClass.ordered())
                raise BadFilter(f"class: unknown class {priority!r} (one of {labels})") from None
        known = {c.value for c in FailureClass}
        if failure is not None and failure not in known | {"*", "ANY"}:
            names = ", ".join(sorted(known))
            raise BadFilter(f"failure: unknown failure class {failure!r} (one of {names}, or *)")
        return cls(consumer=query.get("consumer") or None, priority=priority, failure=failure)

    def __call__(self, event: Event) -> bool:
        if self.consumer is not None and event.consumer != self.consumer:
            return False
        if self.priority is not None and event.priority != self.priority:
            return False
        if self.failure is not None:
            if event.failure is None:
                return False
            if self.failure not in ("*", "ANY") and event.failure.failure_class.value != (
                self.failure
            ):
                return False
        return True


class _Viewer:
    def __init__(self, wanted: EventFilter, snapshots: bool) -> None:
        self.wanted = wanted
        self.snapshots = snapshots
        self.events: collections.deque[Event] = collections.deque(maxlen=BUFFER)
        self.dropped = 0
        self.snapshot_due = snapshots
        self.wake = asyncio.Event()

    def push(self, event: Event) -> None:
        if not self.wanted(event):
            return
        if len(self.events) == self.events.maxlen:
            self.dropped += 1
        self.events.append(event)
        self.wake.set()


def sse(kind: str, data: str) -> bytes:
    """One server-sent event (data is one line of JSON)."""
    return f"event: {kind}\ndata: {data}\n\n".encode()


class LiveFeed:
    """Fans the gate's events and state out to the open streams of one control app."""

    def __init__(
        self,
        gate: Gate,
        document: Callable[[], dict[str, Any]],
        *,
        min_interval: float = MIN_INTERVAL,
    ) -> None:
        self.gate = gate
        self.document = document
        self.min_interval = min_interval
        self._viewers: set[_Viewer] = set()
        self._changed = False
        self._version: tuple[int, ...] = ()
        self._task: asyncio.Task[None] | None = None
        self._running = False

    @property
    def viewers(self) -> int:
        return len(self._viewers)

    def start(self) -> None:
        self._running = True
        self._task = asyncio.create_task(self._watch(), name="gpugate-live")

    async def stop(self) -> None:
        self._running = False
        self.gate.events.unsubscribe(self._on_event)
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        for viewer in self._viewers:
            viewer.wake.set()

    def _on_event(self, event: Event) -> None:
        if not self._running:
            return
        self._changed = True
        for viewer in self._viewers:
            viewer.push(event)

    def _sample_version(self) -> tuple[int, ...]:
        core = self.gate.core
        # A new sample is a new observation object: comparing identities is enough.
        return tuple(id(core.observation(gpu)) for gpu in core.gpus())

    async def _watch(self) -> None:
        while True:
            await asyncio.sleep(self.min_interval)
            if not self._viewers:
                continue
            version = self._sample_version()
            if version != self._version or self._changed:
                self._version = version
                self._changed = False
                for viewer in self._viewers:
                    if viewer.snapshots:
                        viewer.snapshot_due = True
                        viewer.wake.set()

    async def stream(
        self,
        request: web.Request,
        *,
        wanted: EventFilter,
        snapshots: bool,
        backlog: list[Event],
    ) -> web.StreamResponse:
        """Serve one stream until the client leaves or the app stops."""
        response = web.StreamResponse(
            headers={
                "Content-Type": "text/event-stream",
                "Cache-Control": "no-cache",
                "X-Accel-Buffering": "no",
            }
        )
        await response.prepare(request)
        viewer = _Viewer(wanted, snapshots)
        for event in backlog:
            viewer.push(event)
        if not self._viewers and self._running:
            self.gate.events.subscribe(self._on_event, routine=True)
        self._viewers.add(viewer)
        try:
            # Sent at once, so a client knows the stream is open before anything happens.
            await response.write(b": gpugate\n\n")
            while self._running:
                if viewer.snapshot_due:
                    viewer.snapshot_due = False
                    await response.write(sse("snapshot", json.dumps(self.document())))
                while viewer.events:
                    event = viewer.events.popleft()
                    await response.write(sse("event", json.dumps(event_document(event, self.gate))))
                if viewer.dropped:
                    await response.write(sse("dropped", json.dumps({"events": viewer.dropped})))
                    viewer.dropped = 0
                viewer.wake.clear()
                if viewer.events or viewer.snapshot_due:
                    continue
                try:
                    async with asyncio.timeout(KEEPALIVE):
                        await viewer.wake.wait()
                except TimeoutError:
                    await response.write(b": keepalive\n\n")
        except (ConnectionResetError, ConnectionError):
            pass
        finally:
            self._viewers.discard(viewer)
            if not self._viewers:
                self.gate.events.unsubscribe(self._on_event)
        return response
