"""The core's operator actions (a part `GateCore` holds): evict a resident, drain a
consumer, pause a GPU, and the marks that say since when and by whom."""

from __future__ import annotations

from collections.abc import Callable

import attrs

from gpugate.core.books import Books
from gpugate.core.budget import GpuBudget
from gpugate.core.effects import Effect, EventKind, UnloadReason
from gpugate.core.listing import resident_event
from gpugate.core.operator import Mark, action_event, drained_events, refuse_eviction
from gpugate.core.residents import ResidentKey
from gpugate.core.scheduling import Scheduler


class OperatorActions:
    """What an operator does to the books, each an event."""

    def __init__(
        self,
        books: Books,
        scheduler: Scheduler,
        budget: Callable[[int], GpuBudget | None],
    ) -> None:
        """`budget`: a GPU's budget now (what an eviction's event says was schedulable)."""
        self.books = books
        self.scheduler = scheduler
        self.budget = budget

    def evict(self, key: ResidentKey, now: float, force: bool, who: str = "token") -> list[Effect]:
        """An operator unloads an idle resident (a split model: all its parts); raises
        `EvictionRefused` when it may not."""
        resident = self.books.residents.get(key)
        if resident is None and key.part is None:
            resident = next(iter(self.books.parts_of(key)), None)
        refused = refuse_eviction(
            key,
            None if resident is None else resident.policy,
            None if resident is None else resident.state,
            0 if resident is None else resident.in_flight,
            force=force,
        )
        if refused is not None:
            raise refused
        assert resident is not None
        budget = self.budget(resident.gpu)
        before = None if budget is None else budget.schedulable
        unload = self.books.start_unload(resident, UnloadReason.OPERATOR, None, now)
        detail = f"asked by {who}" + (" (forced)" if force else "")
        started = resident_event(
            EventKind.EVICTION_STARTED, now, resident, detail, reason=UnloadReason.OPERATOR.value
        )
        parts = self.books.unload_parts(resident, UnloadReason.OPERATOR, None, now)
        return [unload, attrs.evolve(started, schedulable_before=before), *parts]

    def drain(self, consumer: str, now: float, who: str = "token") -> list[Effect]:
        """A consumer admits nothing new; its in-flight leases finish."""
        book = self.scheduler.operator
        if consumer in book.draining:
            return []
        book.draining.add(consumer)
        book.drained.discard(consumer)
        book.marks[consumer] = Mark(now, who)
        started = action_event(
            EventKind.CONSUMER_DRAINING,
            now,
            who,
            f"{consumer} admits nothing new",
            consumer=consumer,
        )
        return [started, *self.drained(now)]

    def undrain(self, consumer: str, now: float, who: str = "token") -> list[Effect]:
        """A drained consumer admits demands again."""
        book = self.scheduler.operator
        if consumer not in book.draining:
            return []
        book.draining.discard(consumer)
        book.drained.discard(consumer)
        book.marks.pop(consumer, None)
        return [
            action_event(
                EventKind.CONSUMER_UNDRAINED,
                now,
                who,
                f"{consumer} admits again",
                consumer=consumer,
            )
        ]

    def pause(self, gpu: int, now: float, who: str = "token") -> list[Effect]:
        """New demands on the GPU wait in its queue (until resume or their deadline)."""
        book = self.scheduler.operator
        if gpu in book.paused:
            return []
        book.paused.add(gpu)
        book.marks[gpu] = Mark(now, who)
        return [action_event(EventKind.GPU_PAUSED, now, who, "admission paused", gpu=gpu)]

    def resume(self, gpu: int, now: float, who: str = "token") -> list[Effect]:
        """Admission on the GPU runs again: its queue is planned at once."""
        book = self.scheduler.operator
        if gpu not in book.paused:
            return []
        book.paused.discard(gpu)
        book.marks.pop(gpu, None)
        resumed = action_event(EventKind.GPU_RESUMED, now, who, "admission resumed", gpu=gpu)
        return [resumed, *self.scheduler.schedule(gpu, now)]

    def draining(self, consumer: str) -> tuple[bool, bool]:
        """(draining, drained) for a consumer."""
        book = self.scheduler.operator
        return consumer in book.draining, consumer in book.drained

    def paused(self) -> list[int]:
        return sorted(self.scheduler.operator.paused)

    def mark(self, target: int | str) -> Mark | None:
        """Since when and by whom a GPU (by index) is paused or a consumer (by name) drains."""
        return self.scheduler.operator.marks.get(target)

    def drained(self, now: float) -> list[Effect]:
        """`consumer_drained` for each draining consumer that holds no lease any more."""
        book = self.scheduler.operator
        if not book.draining:
            return []
        holding = {lease.key.consumer for lease in self.books.leases.values()}
        return drained_events(book, holding, now)
