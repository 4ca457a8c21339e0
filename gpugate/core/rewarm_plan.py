"""Which rewarms to start now, and their start (`gpugate.core.rewarm` keeps the book).

Apart from the book because it asks `gpugate.core.capacity` what a demand would get, and
capacity reads `GateCore`, which holds the book.
"""

from __future__ import annotations

import attrs

from gpugate.core.capacity import Ask, Verdict, assess
from gpugate.core.effects import EventKind
from gpugate.core.passes import Admission
from gpugate.core.residents import ResidentState
from gpugate.core.rewarm import rewarm_event
from gpugate.core.state import GateCore
from gpugate.core.tickets import Demand

_HELD = (ResidentState.LOADING, ResidentState.RESIDENT)


def due(core: GateCore, now: float) -> list[Demand]:
    """The rewarms to start now, at most one per GPU: remembered models not held in any
    way, on a GPU where no ticket waits (a real demand's or another rewarm's), that their
    class would be granted now or after evicting only idle residents. Changes only the
    book (it forgets what is resident again or past its time-to-live)."""
    book = core.rewarms
    book.forget_expired(now)
    # A GPU where anything waits is not for a rewarm: a real demand goes first, and
    # another rewarm's plan is to be carried out before the next is planned.
    busy_gpus = {t.demand.gpu for t in core.scheduler.tickets.values()}
    chosen: list[Demand] = []
    for key, evicted in list(book.evicted.items()):
        held = core.books.residents.same_model(evicted.gpu, key.consumer, key.model)
        if any(r.state in _HELD for r in held):
            del book.evicted[key]  # resident again: a request brought it back
            continue
        if held:
            continue  # still unloading
        if not book.wants(key, evicted.policy):
            del book.evicted[key]  # its setting changed
            continue
        if evicted.gpu in busy_gpus:
            continue
        if any(lease.key.whole == key for lease in core.books.leases.values()):
            continue
        demand = evicted.demand(now)
        verdict = assess(core, Ask.of(demand), now).verdict
        if verdict in (Verdict.FITS, Verdict.AFTER_EVICTION):
            chosen.append(demand)
            busy_gpus.add(evicted.gpu)  # one per GPU and call: the next planned after it
    return chosen


def start(core: GateCore, demand: Demand, now: float) -> Admission:
    """Submit a rewarm chosen by `due` in the same event (nothing may change between):
    through the scheduler like any request, bypassing only `make_way`, which is for real
    demands. Its Admission is the gate's to wait on like a request's."""
    admission = core.scheduler.submit(demand, now)
    if admission.failure is not None:
        failed = rewarm_event(EventKind.REWARM_FAILED, now, demand, admission.failure.message)
        return attrs.evolve(admission, effects=(*admission.effects, failed))
    ttl = "never" if demand.idle_ttl is None else f"in {demand.idle_ttl:.0f}s"
    evicted = core.rewarms.evicted.get(demand.key)
    by = "" if evicted is None else f"evicted for a demand of class {evicted.by.label}; "
    started = rewarm_event(
        EventKind.REWARM_STARTED, now, demand, f"{by}its time-to-live ends {ttl}"
    )
    core.rewarms.under_way[admission.ticket_id] = demand
    return attrs.evolve(admission, effects=(started, *admission.effects))
