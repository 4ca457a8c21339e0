"""The event hub: a resident lease's events are kept as the lease and built when read,
or at once for whoever follows events one by one."""

from __future__ import annotations

import logging

import pytest

from gpugate.core.classes import PriorityClass
from gpugate.core.effects import Event, EventKind
from gpugate.core.failures import Failure, FailureClass
from gpugate.core.scheduling import granted_event
from gpugate.core.scopes import released_event
from gpugate.core.tickets import Lease
from gpugate.gate import events as events_module
from gpugate.gate.events import EventHub
from tests.core.builders import demand


def resident_lease(lease_id: int = 7, at: float = 1.0) -> Lease:
    return Lease(lease_id, demand("m", 100), granted=at, waited=0.0, pending=0, loads=False)


def failure_event() -> Event:
    failure = Failure(FailureClass.QUEUE_FULL, "QUEUE_FULL: x", consumer="ollama", model="m")
    return Event(EventKind.FAILURE, 3.0, consumer="ollama", model="m", failure=failure)


@pytest.fixture
def built(monkeypatch: pytest.MonkeyPatch) -> list[Event]:
    """Every routine event the hub builds."""
    made: list[Event] = []

    def granted(lease: Lease) -> Event:
        made.append(granted_event(lease))
        return made[-1]

    def released(lease: Lease, now: float, reason: str) -> Event:
        made.append(released_event(lease, now, reason))
        return made[-1]

    monkeypatch.setattr(events_module, "granted_event", granted)
    monkeypatch.setattr(events_module, "released_event", released)
    return made


def test_recent_events_show_a_resident_lease_as_the_core_would_have(built):
    hub = EventHub()
    lease = resident_lease()
    hub.granted(lease)
    hub.released(lease, 2.5, failed=True)
    hub.publish(failure_event())
    assert built == []  # nobody followed them: nothing was built until read

    recent = hub.recent()
    assert recent == [
        granted_event(lease),
        released_event(lease, 2.5, "failed"),
        failure_event(),
    ]
    assert (recent[0].bytes, recent[0].wait, recent[0].priority) == (0, 0.0, "interactive")
    assert (recent[1].time, recent[1].reason) == (2.5, "failed")


def test_recent_events_are_bounded_whatever_they_are_kept_as():
    hub = EventHub(keep=3)
    for n in range(1, 4):
        hub.granted(resident_lease(n))
    hub.publish(failure_event())
    assert [e.kind for e in hub.recent()] == [EventKind.LEASE_GRANTED] * 2 + [EventKind.FAILURE]


async def test_routine_events_reach_those_who_follow_them_and_no_one_else(built):
    hub = EventHub()
    every: list[Event] = []
    quiet: list[Event] = []
    hub.subscribe(every.append, routine=True)
    hub.subscribe(quiet.append)
    assert hub.followers == 1
    lease = resident_lease()
    released = hub.next(lambda e: e.kind is EventKind.LEASE_RELEASED)
    hub.granted(lease)
    hub.released(lease, 2.0, failed=False)
    other = granted_event(resident_lease(8, at=4.0))
    hub.publish(other)
    hub.publish(failure_event())

    assert every == [*built[:2], other, failure_event()]
    assert quiet == [failure_event()]
    assert released.done() and released.result() == released_event(lease, 2.0, "done")

    hub.unsubscribe(every.append)
    assert hub.followers == 0
    hub.granted(resident_lease(9))
    assert len(built) == 2 and len(every) == 4


def test_routine_events_are_logged_at_debug_only(built, caplog):
    hub = EventHub()
    with caplog.at_level(logging.INFO, logger="gpugate.events"):
        hub.granted(resident_lease())
    assert caplog.records == [] and built == []
    with caplog.at_level(logging.DEBUG, logger="gpugate.events"):
        hub.granted(resident_lease(8))
    (record,) = caplog.records
    assert record.levelno == logging.DEBUG and '"event": "lease_granted"' in record.getMessage()


def test_a_lease_that_brings_memory_is_logged_at_info_once(built, caplog):
    hub = EventHub()
    loading = Lease(
        9, demand("qwen", 5 << 30), granted=2.0, waited=0.5, pending=5 << 30, loads=True
    )
    with caplog.at_level(logging.DEBUG, logger="gpugate.events"):
        hub.publish(granted_event(loading))
        hub.publish(granted_event(resident_lease(10)))
    levels = [(r.levelno, '"lease": 9' in r.getMessage()) for r in caplog.records]
    assert levels == [(logging.INFO, True), (logging.DEBUG, False)]


def test_every_grant_is_counted_by_consumer_and_class_and_its_wait_if_any():
    hub = EventHub()
    hub.granted(resident_lease(1))
    hub.granted(resident_lease(2))
    waited = Lease(3, demand("m", 100), granted=5.0, waited=0.25, pending=100, loads=True)
    hub.publish(granted_event(waited))
    hub.publish(released_event(waited, 6.0, "done"))
    assert hub.tally.granted == {("ollama", PriorityClass.INTERACTIVE): 3}
    ((label, (cumulative, total)),) = hub.tally.histogram().items()
    # Two waits of 0 in the first bucket, one of 0.25 s in the `le="0.25"` one.
    assert label == "interactive" and total == 0.25
    assert cumulative[:6] == [2, 2, 2, 2, 3, 3] and cumulative[-1] == 3
