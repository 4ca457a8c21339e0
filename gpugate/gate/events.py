"""Where events go: one JSON log line each, the store, the metrics, and waiters."""

from __future__ import annotations

import asyncio
import collections
import json
import logging
from collections.abc import Callable

from gpugate.core.effects import Event, EventKind

log = logging.getLogger("gpugate.events")

ROUTINE = frozenset({EventKind.LEASE_GRANTED, EventKind.LEASE_RELEASED})
"""One of each per request: logged at DEBUG, recorded in the lease history instead."""

EventFilter = Callable[[Event], bool]


def event_json(event: Event) -> str:
    """One JSON log line for an event."""
    record: dict[str, object] = {"event": event.kind.value}
    if event.failure is not None:
        record.update(event.failure.as_event())
        record["event"] = event.kind.value
    for name in (
        "consumer",
        "model",
        "gpu",
        "bytes",
        "wait",
        "reason",
        "schedulable_before",
        "schedulable_after",
    ):
        value = getattr(event, name)
        if value is not None and name not in record:
            record[name] = value
    if event.key is not None and event.key.options:
        record["options"] = event.key.options
    if event.detail and "message" not in record:
        record["detail"] = event.detail
    return json.dumps(record)


class EventHub:
    """Fans events out to subscribers and keeps the recent ones for the control API."""

    def __init__(self, keep: int = 500) -> None:
        self.recent: collections.deque[Event] = collections.deque(maxlen=keep)
        self._subscribers: list[Callable[[Event], None]] = []
        self._waiters: list[tuple[EventFilter, asyncio.Future[Event]]] = []

    def subscribe(self, callback: Callable[[Event], None]) -> None:
        self._subscribers.append(callback)

    def publish(self, event: Event) -> None:
        self.recent.append(event)
        level = logging.DEBUG if event.kind in ROUTINE else logging.INFO
        if log.isEnabledFor(level):
            log.log(level, event_json(event))
        for callback in self._subscribers:
            callback(event)
        if self._waiters:
            still = []
            for predicate, future in self._waiters:
                if future.done():
                    continue
                if predicate(event):
                    future.set_result(event)
                else:
                    still.append((predicate, future))
            self._waiters = still

    def next(self, predicate: EventFilter) -> asyncio.Future[Event]:
        """A future for the next event that matches (registered now, before it happens)."""
        future: asyncio.Future[Event] = asyncio.get_running_loop().create_future()
        self._waiters.append((predicate, future))
        return future
