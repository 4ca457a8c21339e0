"""The core's events for what the world reports (a part `GateCore` holds): a runtime
answered a lease's request or a started process answers, a process ended, an NVML sample,
a runtime's listing of what it has loaded, and an unload that finished."""

from __future__ import annotations

from collections.abc import Sequence

from gpugate.core import early, floors
from gpugate.core.books import Books
from gpugate.core.effects import Effect, Event, EventKind
from gpugate.core.failures import Failure, FailureClass
from gpugate.core.listing import ListedModel, apply_listing
from gpugate.core.observation import HostObservation
from gpugate.core.passes import FailureFactory
from gpugate.core.relief import relieve_pressure
from gpugate.core.residents import ResidentKey, ResidentState
from gpugate.core.scheduling import Scheduler
from gpugate.core.scopes import (
    accounted,
    listed_scopes,
    observed_scopes,
    process_ended,
    released_event,
    switched,
)
from gpugate.core.suspects import clear_suspects
from gpugate.core.telemetry import Telemetry
from gpugate.core.tickets import LeaseScope
from gpugate.core.units import format_gib


class Reports:
    """Loads and processes that came up or ended, samples, listings and finished unloads."""

    def __init__(
        self, books: Books, telemetry: Telemetry, scheduler: Scheduler, *, fail: FailureFactory
    ) -> None:
        self.books = books
        self.telemetry = telemetry
        self.scheduler = scheduler
        self._fail = fail

    def loaded(self, lease_id: int, now: float) -> list[Effect]:
        """The runtime answered the lease's request, so its model is in VRAM now (a
        switch's: the process's only model, whatever NVML shows yet)."""
        lease = self.books.leases.get(lease_id)
        if lease is None or not lease.pending or not lease.demand.loads_model:
            return []
        self.scheduler.after_loads.completed(lease, now)
        self.books.materialise(lease, now)
        effects: list[Effect] = []
        if lease.demand.switch:
            effects.extend(switched(self.books, lease, now))
        if not self.scheduler.queues.get(lease.gpu):
            return effects
        return effects + self.scheduler.schedule(lease.gpu, now)

    def process_ready(self, lease_id: int, now: float) -> list[Effect]:
        """A process started under a PROCESS lease answers on its port and health route: it
        is resident now, whatever NVML shows yet; from here its bytes follow NVML."""
        lease = self.books.leases.get(lease_id)
        if lease is None or lease.scope is not LeaseScope.PROCESS:
            return []
        closed = self.books.close_lease(lease_id, now, failed=False)
        if closed is None:
            return []
        lease, resident = closed
        if resident is not None:
            resident.tracks_observed = resident.process = True
            # An adopted process may hold more than its lease asked: what NVML last showed.
            observation = self.telemetry.observations.get(lease.gpu)
            if observation is not None:
                consumer = lease.key.consumer
                room = observation.managed.get(consumer, 0) - accounted(
                    self.books, consumer, lease.gpu, but=resident.key
                )
                if room > 0:
                    resident.shown = True
                    resident.bytes = max(resident.bytes, room)
                    self.books.touch()
        effects: list[Effect] = [released_event(lease, now, "resident")]
        self.telemetry.explain(lease.gpu, self.books)
        if self.scheduler.queues.get(lease.gpu):
            effects.extend(self.scheduler.schedule(lease.gpu, now))
        return effects

    def process_ended(self, consumer: str, now: float, detail: str) -> list[Effect]:
        """The consumer's process ended (a crash, an exit): its resident goes at once."""
        effects: list[Effect] = list(process_ended(self.books, consumer, now, detail))
        if effects:
            for gpu in sorted(self.telemetry.observations):
                self.telemetry.explain(gpu, self.books)
                if self.scheduler.queues.get(gpu):
                    effects.extend(self.scheduler.schedule(gpu, now))
        return effects

    def observe(self, sample: HostObservation, now: float) -> list[Effect]:
        """A new NVML sample, or a driver fault."""
        effects: list[Effect] = []
        for gpu in self.telemetry.observe(sample, self.books):
            self.books.touch(residents=False, gpu=gpu)  # its budget moved; the residents did not
            effects.extend(self._overruns(gpu, now))
            effects.extend(self._observed_scopes(gpu, now))
            settling = early.settling(
                gpu,
                self.scheduler.queues.get(gpu) or (),
                self.telemetry.unexplained.get(gpu, {}),
                self.scheduler.withdrawing,
            )
            effects.extend(
                relieve_pressure(self.books, self.telemetry, gpu, now, settling=settling)
            )
            effects.extend(self.scheduler.schedule(gpu, now))
        return effects

    def reconcile(
        self,
        consumer: str,
        gpus: int | Sequence[int],
        listed: Sequence[ListedModel],
        *,
        asked_at: float,
        now: float,
    ) -> list[Effect]:
        """A runtime on `gpus` listed what it has loaded (asked at `asked_at`, answered by
        `now`).

        Residents it no longer lists are gone; models it lists that the books do not know
        were loaded behind the gate's back and become residents like any other (on the GPU
        where its memory is unexplained); measured sizes replace envelopes.
        """
        cards = (gpus,) if isinstance(gpus, int) else tuple(gpus)
        names = {m.model for m in listed}
        effects: list[Effect] = []
        for gpu in cards:
            effects += listed_scopes(self.books, consumer, gpu, names, asked_at=asked_at, now=now)
        found_on = self.telemetry.unexplained_card(consumer, cards)
        listing = apply_listing(
            self.books, consumer, cards, listed, asked_at=asked_at, now=now, found_on=found_on
        )
        for effect in listing:
            # A model the runtime let go on its own (a client's unload, its own idle timer):
            # what the driver still holds of it for a moment is its memory on the way back,
            # as after an unload the gate confirmed.
            gone = isinstance(effect, Event) and effect.kind is EventKind.RESIDENT_GONE
            if gone and effect.gpu is not None and effect.bytes:
                self.telemetry.unloaded(effect.gpu, effect.bytes, now)
        effects += listing
        self.books.touch()
        for gpu in cards:
            self.telemetry.explain(gpu, self.books)
            effects.extend(self.scheduler.schedule(gpu, now))
        return effects

    def unloaded(
        self, key: ResidentKey, now: float, *, reclaimed: bool, failure: Failure | None = None
    ) -> list[Effect]:
        """An unload finished: NVML showed the bytes back, or it did not in time.

        `failure`: the runtime could not be asked (refused, timed out, answered nonsense);
        the ticket the unload was for fails with that class, not GPU_MEMORY_NOT_RECLAIMED.
        """
        finished = self.books.finish_unload(key)
        if finished is None:
            return []
        self.books.unloaded_at[(key.consumer, key.model)] = now
        unload, resident = finished
        if failure is not None:
            detail = f"unload failed: {failure.failure_class.value}"
        elif reclaimed:
            detail = "reclaimed"
            self.telemetry.unloaded(unload.gpu, unload.bytes, now)
        else:
            detail = "not reclaimed"
            if resident is not None:
                # The runtime said it unloaded, NVML says the bytes are still taken: keep
                # counting them, and do not ask again in a loop.
                resident.state = ResidentState.SUSPECT
                resident.changed_at = now
                self.books.residents[key] = resident
                self.books.touch()
        # What the card offers now that the unload is over, before anyone takes it.
        self.telemetry.explain(unload.gpu, self.books)
        budget = self.telemetry.budget(unload.gpu, self.books)
        after = None if budget is None else budget.schedulable
        if after is not None:
            detail = f"{detail}; {format_gib(after)} schedulable after"
        effects: list[Effect] = [
            Event(
                EventKind.EVICTION_DONE,
                now,
                key=key,
                gpu=unload.gpu,
                bytes=unload.bytes,
                reason=unload.reason.value,
                detail=detail,
                schedulable_after=after,
            )
        ]
        if not reclaimed and unload.for_ticket is not None:
            ticket = self.scheduler.tickets.get(unload.for_ticket)
            if ticket is not None:
                if failure is not None:
                    failure_class = failure.failure_class
                    extra = f"; {key} could not be unloaded: {failure.message}"
                else:
                    failure_class = FailureClass.GPU_MEMORY_NOT_RECLAIMED
                    extra = (
                        f"; {key} was unloaded but NVML did not show its "
                        f"{unload.bytes / 2**30:.1f} GiB come back"
                    )
                rejection = self._fail(
                    failure_class, ticket.demand, ticket.demand.envelope, now, extra=extra
                )
                effects.extend(self.scheduler.reject(ticket, rejection, now))
        effects.extend(self.scheduler.schedule(unload.gpu, now))
        return effects

    def _overruns(self, gpu: int, now: float) -> list[Effect]:
        """Consumers the sample shows holding more than their leases (before the residents
        that follow NVML take what it shows)."""
        observation = self.telemetry.observations.get(gpu)
        if observation is None:
            return []
        waiting = self.scheduler.queues.get(gpu) or ()
        early = {t.demand.consumer for t in waiting if t.demand.started is not None}
        early |= {consumer for consumer, card in self.scheduler.withdrawing if card == gpu}
        unexplained = self.telemetry.unexplained.get(gpu, {})
        may_grow = floors.headroom_by_consumer(self.books, gpu)
        return self.telemetry.overruns.observe(
            observation, self.books, unexplained, now, early=early, may_grow=may_grow
        )

    def _observed_scopes(self, gpu: int, now: float) -> list[Effect]:
        obs = self.telemetry.observations.get(gpu)
        effects: list[Effect] = []
        if obs is not None:
            effects.extend(clear_suspects(self.books, obs, now))
            effects.extend(observed_scopes(self.books, obs, now))
        if effects:
            self.telemetry.explain(gpu, self.books)
        return effects
