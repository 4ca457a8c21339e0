"""The core's lifecycle events (a part `GateCore` holds): runtimes that are started,
stopped, put to sleep and woken, as their lifecycle interface reports it
(core/lifecycle.py)."""

from __future__ import annotations

from typing import Protocol

from gpugate.core.books import Books
from gpugate.core.effects import Effect, Event, EventKind, Start, Wake
from gpugate.core.lifecycle import Eviction, LifeReport, LifeState
from gpugate.core.tickets import LeaseScope


class LeaseEnds(Protocol):
    """The core's events a lifecycle report leads to: a start's lease becomes its
    resident, or is released; a process that ended takes its residents."""

    def process_ready(self, lease_id: int, now: float) -> list[Effect]: ...

    def process_ended(self, consumer: str, now: float, detail: str) -> list[Effect]: ...

    def release(self, lease_id: int, now: float, *, failed: bool = False) -> list[Effect]: ...


class LifecycleEvents:
    """Starts, wakes and what became of them."""

    def __init__(self, books: Books, ends: LeaseEnds) -> None:
        self.books = books
        self.ends = ends

    def register(self, consumer: str, eviction: Eviction, now: float) -> None:
        """`consumer` has a lifecycle: its evictions are stops (or sleeps), its starts effects."""
        self.books.lives.register(consumer, eviction, now)

    def start(self, consumer: str, lease_id: int, now: float) -> list[Effect]:
        """The runtime's PROCESS lease `lease_id` is held: start it, or wake it when it
        sleeps; nothing when it is starting or up already."""
        lease = self.books.leases.get(lease_id)
        if lease is None or lease.scope is not LeaseScope.PROCESS:
            return []
        before = self.books.lives.start(consumer, lease_id, now)
        if before is None:
            return []
        how = Wake if before is LifeState.ASLEEP else Start
        return [how(consumer, lease.gpu, lease_id), self._life_event(consumer, before, now)]

    def reported(
        self, consumer: str, report: LifeReport, now: float, detail: str = ""
    ) -> list[Effect]:
        """The lifecycle interface reports what became of the runtime: a start's lease
        becomes its resident (UP) or is released (failed); a start that failed or a
        process that ended takes its resident and its pending start leases with it."""
        outcome = self.books.lives.report(consumer, report, now)
        if outcome is None:
            return []
        effects: list[Effect] = []
        if outcome.after is not outcome.before:
            effects.append(self._life_event(consumer, outcome.before, now, detail))
        if outcome.start_lease is not None:
            if outcome.after is LifeState.UP:
                effects.extend(self.ends.process_ready(outcome.start_lease, now))
            else:
                effects.extend(self.ends.release(outcome.start_lease, now, failed=True))
        ended = (LifeReport.START_FAILED, LifeReport.EXITED, LifeReport.ENDED_SWITCHING)
        if report in ended:
            effects.extend(self.ends.process_ended(consumer, now, detail or report.value))
        if report in (LifeReport.EXITED, LifeReport.ENDED_SWITCHING):
            for lease in list(self.books.leases.values()):
                mine = lease.key.consumer == consumer and lease.scope is LeaseScope.PROCESS
                if mine and lease.pending:
                    effects.extend(self.ends.release(lease.id, now, failed=True))
        return effects

    def _life_event(self, consumer: str, before: LifeState, now: float, detail: str = "") -> Event:
        life = self.books.lives.get(consumer)
        after = life.state.value if life is not None else "?"
        why = f": {detail}" if detail else ""
        return Event(
            EventKind.LIFECYCLE, now, consumer=consumer, detail=f"{before.value} → {after}{why}"
        )
