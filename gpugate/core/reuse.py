"""The common case, kept cheap: a request for a model that is already resident.

Such a request is granted a zero-byte lease at once, and its end usually leaves nothing
to decide: no ticket, no planner pass, no unload, no deadline but the resident's own idle
expiry. `ResidentReuse` does only the books' part of `GateCore.submit` and
`GateCore.release` for it, and answers None whenever anything more is involved (the
caller then takes the full path, which decides exactly as before).

It returns no effects: the lease is the record of both its events. Its grant is
`granted_event(lease)` (LEASE_GRANTED at `lease.granted`, 0 bytes, no wait), its end
`released_event(lease, now, reason)`; the caller builds them only for whoever reads them
one by one.
"""

from __future__ import annotations

from gpugate.core.books import Books
from gpugate.core.residents import Resident, ResidentState
from gpugate.core.scheduling import Scheduler
from gpugate.core.tickets import Demand, Lease, LeaseScope


class ResidentReuse:
    """Zero-byte REQUEST leases on resident models, granted and ended without effects."""

    def __init__(self, books: Books, scheduler: Scheduler) -> None:
        self.books = books
        self.queues = scheduler.queues
        self.operator = scheduler.operator

    def grant(self, demand: Demand, now: float) -> Lease | None:
        """The lease `GateCore.submit` would grant at once on a resident that serves the
        demand as it is; None: submit it (not such a demand, a queue on its GPU, its
        consumer draining or its GPU paused)."""
        if demand.scope is not LeaseScope.REQUEST or demand.lease_ttl is not None:
            return None
        books = self.books
        resident = books.reusable(demand.key)
        if resident is None:
            return None
        if self.queues.get(demand.gpu):
            return None  # an earlier ticket may wait to evict it: the swap bound decides
        operator = self.operator
        if operator.draining and demand.key.consumer in operator.draining:
            return None
        if operator.paused and demand.gpu in operator.paused:
            return None
        return books.lend(books.new_id(), demand, now, 0.0, resident)

    def release(self, lease: Lease, now: float) -> Resident | None:
        """End a zero-byte REQUEST lease whose end leaves nothing else to do, as
        `GateCore.release` would; returns the resident it used (its idle expiry may be the
        next deadline). None: nothing was done — release it through `GateCore.release`
        (not such a lease, already ended, a queue to plan again on its GPU, a draining
        consumer, or a resident its end unloads)."""
        demand = lease.demand
        if lease.pending or demand.scope is not LeaseScope.REQUEST or demand.lease_ttl is not None:
            return None
        books = self.books
        if books.leases.get(lease.id) is not lease:
            return None
        if self.operator.draining or self.queues.get(demand.gpu):
            return None
        key = demand.key
        resident = books.residents.get(key) if lease.loads else books.reusable(key)
        if resident is None:
            return None
        if (
            resident.idle_ttl == 0
            and resident.in_flight <= 1
            and resident.state is ResidentState.RESIDENT
        ):
            return None  # its last request ends: a load-on-demand model is unloaded now
        books.give_back(lease, resident, now)
        return resident
