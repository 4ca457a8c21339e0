"""Where events go: one JSON log line each, the store, the metrics, and waiters.

The two events of every request (LEASE_GRANTED, LEASE_RELEASED) are routine: logged at
DEBUG, recorded in the lease history rather than the events table, and counted for
`/metrics` in `LeaseTally` rather than handed to the metrics one by one. A lease on a
resident model is not even built into `Event`s on the request path: the hub keeps the
lease itself among the recent events and builds its events when they are read, or at
once only while someone follows events one by one (a live stream's viewer, a waiter,
the DEBUG log).
"""

from __future__ import annotations

import asyncio
import bisect
import collections
import json
import logging
from collections.abc import Callable

from gpugate.core.classes import PriorityClass
from gpugate.core.effects import Event, EventKind
from gpugate.core.scheduling import granted_event
from gpugate.core.scopes import released_event
from gpugate.core.tickets import Lease

log = logging.getLogger("gpugate.events")

ROUTINE = frozenset({EventKind.LEASE_GRANTED, EventKind.LEASE_RELEASED})
"""One of each per request: logged at DEBUG, recorded in the lease history instead."""

WAIT_BUCKETS = (0.001, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)
"""Upper bounds of the lease wait histogram's buckets, in seconds (+Inf follows)."""

EventFilter = Callable[[Event], bool]
Subscriber = Callable[[Event], None]

_CLASSES = {klass.label: klass for klass in PriorityClass}

Recent = Event | Lease | tuple[Lease, float, bool]
"""A recent event as the hub keeps it: an event, a resident lease standing for its grant,
or (lease, time, failed) standing for its end."""


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
        "lease",
        "ceiling",
    ):
        value = getattr(event, name)
        if value is not None and name not in record:
            record[name] = value
    if event.key is not None and event.key.options:
        record["options"] = event.key.options
    if event.detail and "message" not in record:
        record["detail"] = event.detail
    return json.dumps(record)


def built(entry: Recent) -> Event:
    """The event a recent entry stands for."""
    if isinstance(entry, Event):
        return entry
    if isinstance(entry, tuple):
        lease, at, failed = entry
        return released_event(lease, at, "failed" if failed else "done")
    return granted_event(entry)


class WaitCounts:
    """The waits of one class that were not 0, by the histogram's buckets, and their sum."""

    def __init__(self) -> None:
        self.buckets = [0] * (len(WAIT_BUCKETS) + 1)
        self.sum = 0.0

    def observe(self, wait: float) -> None:
        # A wait on a bucket's bound counts in that bucket, as Prometheus's `le` says.
        self.buckets[bisect.bisect_left(WAIT_BUCKETS, wait)] += 1
        self.sum += wait


class LeaseTally:
    """Every lease granted, counted as plain integers for `/metrics` to read when scraped.

    `granted` counts each grant by consumer and class. Every grant is one observation of
    the wait histogram; `waits` keeps only those that were not 0, so a grant on a resident
    model costs one count. The waits of 0 are the class's grants less its observations,
    and they belong in the first bucket.
    """

    def __init__(self) -> None:
        self.granted: dict[tuple[str, PriorityClass | str], int] = {}
        self.waits: dict[PriorityClass | str, WaitCounts] = {}

    def count(self, event: Event) -> None:
        """A LEASE_GRANTED event."""
        label = event.priority or ""
        klass = _CLASSES.get(label, label)
        key = (event.consumer or "", klass)
        self.granted[key] = self.granted.get(key, 0) + 1
        if event.wait:
            counts = self.waits.get(klass)
            if counts is None:
                counts = self.waits[klass] = WaitCounts()
            counts.observe(event.wait)

    def histogram(self) -> dict[str, tuple[list[int], float]]:
        """Per class label: cumulative counts by bucket (the last one +Inf) and the sum."""
        grants: dict[PriorityClass | str, int] = {}
        for (_, klass), n in self.granted.items():
            grants[klass] = grants.get(klass, 0) + n
        rows = {}
        for klass, total in grants.items():
            counts = self.waits.get(klass) or WaitCounts()
            running = total - sum(counts.buckets)
            cumulative = []
            for n in counts.buckets:
                running += n
                cumulative.append(running)
            rows[label_of(klass)] = (cumulative, counts.sum)
        return rows


def label_of(klass: PriorityClass | str) -> str:
    return klass.label if isinstance(klass, PriorityClass) else klass


class EventHub:
    """Fans events out to subscribers and keeps the recent ones for the control API."""

    def __init__(self, keep: int = 500) -> None:
        self._recent: collections.deque[Recent] = collections.deque(maxlen=keep)
        self.tally = LeaseTally()
        self._every: list[Subscriber] = []
        """Subscribers to every event, routine ones included."""
        self._quiet: list[Subscriber] = []
        """Subscribers to every event but the routine ones."""
        self._waiters: list[tuple[EventFilter, asyncio.Future[Event]]] = []

    def subscribe(self, callback: Subscriber, *, routine: bool = False) -> None:
        """Call `callback` with each event as it happens; the routine ones (two a request)
        only with `routine` (they cost their `Event`s then: subscribe only while needed)."""
        (self._every if routine else self._quiet).append(callback)

    def unsubscribe(self, callback: Subscriber) -> None:
        for callbacks in (self._every, self._quiet):
            if callback in callbacks:
                callbacks.remove(callback)

    @property
    def followers(self) -> int:
        """Who gets routine events one by one now (subscribers and waiters)."""
        return len(self._every) + len(self._waiters)

    def recent(self) -> list[Event]:
        """The recent events, oldest first."""
        return [built(entry) for entry in self._recent]

    def publish(self, event: Event) -> None:
        self._recent.append(event)
        kind = event.kind
        if kind is EventKind.LEASE_GRANTED or kind is EventKind.LEASE_RELEASED:
            if kind is EventKind.LEASE_GRANTED:
                self.tally.count(event)
                # A lease that brings memory (a load, a start, a job) is worth a line at
                # INFO; the many 0-byte leases on resident models stay at DEBUG.
                if event.bytes and log.isEnabledFor(logging.INFO):
                    log.info(event_json(event))
                    self._follow(event, logged=True)
                    return
            self._follow(event)
            return
        if log.isEnabledFor(logging.INFO):
            log.info(event_json(event))
        for callback in self._quiet:
            callback(event)
        for callback in self._every:
            callback(event)
        if self._waiters:
            self._wake(event)

    def granted(self, lease: Lease) -> None:
        """A lease on a resident model was granted at once (0 bytes, no wait)."""
        self._recent.append(lease)
        demand = lease.demand
        key = (demand.key.consumer, demand.priority)
        granted = self.tally.granted
        granted[key] = granted.get(key, 0) + 1
        if self._every or self._waiters or log.isEnabledFor(logging.DEBUG):
            self._follow(granted_event(lease))

    def released(self, lease: Lease, now: float, failed: bool) -> None:
        """A lease `granted` above ended at `now`."""
        self._recent.append((lease, now, failed))
        if self._every or self._waiters or log.isEnabledFor(logging.DEBUG):
            self._follow(released_event(lease, now, "failed" if failed else "done"))

    def _follow(self, event: Event, *, logged: bool = False) -> None:
        """A routine event to whoever follows them one by one."""
        if not logged and log.isEnabledFor(logging.DEBUG):
            log.debug(event_json(event))
        for callback in self._every:
            callback(event)
        if self._waiters:
            self._wake(event)

    def _wake(self, event: Event) -> None:
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
