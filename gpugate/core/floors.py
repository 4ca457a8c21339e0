"""Floor and ceiling leases, and loads that size themselves to the memory they see free.

A runtime whose load degrades (loading a model partially, or with a shorter context) runs
it in less than its envelope, down to its floor (`Demand.floor`). The core plans every
demand for its ceiling (its envelope) first, with evictions, waits and preemption as for
any demand. It grants the floor instead only where the ceiling cannot be had by the
demand's deadline:

* **at once**, when the planner finds the ceiling can never be had
  (INSUFFICIENT_SCHEDULABLE_VRAM: more than could ever be freed for it) or not before its
  maximum wait (DEADLINE_CANNOT_BE_MET). Waiting would only make its client wait for an
  answer known now, and the runtime would run it anyway;
* **at its deadline**, when it waited for a ceiling the planner expected in time (a busy
  holder finishing, an unload under way) and it has not come: the floor if it fits in what
  is free for it then, with no evictions (they would end after the deadline), else
  LEASE_TIMEOUT as before.

Where the ceiling can never be had, the most the demand can have now (what is free and
what the residents it may evict now hold, above its floor) is planned first, and taken
when that plan grants or evicts: the runtime takes what it finds free, so its lease had
better say what it will hold. Else the floor. Either is planned as a demand of its own
(evicting for it as usual, the margin held), so nothing is evicted for a demand that is
then refused. A ticket planned degraded stays there. A demand with no floor (a runtime
that, short of memory, would offload to the CPU: a failure the gate prevents, not a mode
it grants) is never degraded.

A load that sizes itself (`Sizing.FITS_FREE`) takes what it sees free when it loads, up to
its ceiling; NVML shows it as free whatever the gate leased. Two rules keep another lease's
bytes from it:

* **It starts only when every other lease on its card is allocated.** While another lease
  there (another consumer's, or another load of its own; a job's own job lease excepted)
  holds bytes NVML does not show yet (a load under way, a job lease
  above what its job holds, an explicit lease its process has not used), a grant of its
  is a wait (`await_allocations`): it would take those bytes for its own.
* **While it may still grow, its growth is nobody else's.** A self-sizing load granted less
  than its ceiling (at its floor) may take up to its ceiling of whatever comes free while it
  loads (a request's until its runtime answers, a job's until the job ends). Every pass on
  its card holds that much back from the other tickets (`headroom`), and a load that has
  completed keeps it held until a sample taken after it shows what the load took
  (`AfterLoads`): the books know only its floor.

A load granted its ceiling takes no more than that, so while it loads the others plan as
for any load.
"""

from __future__ import annotations

import attrs

from gpugate.core.books import Books
from gpugate.core.budget import GpuBudget
from gpugate.core.effects import Event, EventKind
from gpugate.core.failures import FailureClass
from gpugate.core.overrun import TOLERANCE
from gpugate.core.planner import Plan, PlanKind
from gpugate.core.tickets import Degraded, Demand, Lease, LeaseScope, Sizing
from gpugate.core.units import format_gib

DEGRADES = (FailureClass.INSUFFICIENT_SCHEDULABLE_VRAM, FailureClass.DEADLINE_CANNOT_BE_MET)
"""The ceiling's failures that a floor may answer (EVICTION_NOT_ALLOWED is no lack of
memory: a floor would not change it)."""


def may_degrade(demand: Demand, decision: Plan) -> bool:
    """Whether the demand's floor is planned, its ceiling having met `decision`."""
    return (
        demand.floor is not None
        and demand.degraded is None
        and decision.kind is PlanKind.FAIL
        and decision.failure in DEGRADES
    )


def at_floor(demand: Demand, reason: FailureClass, why: str, nbytes: int | None = None) -> Demand:
    """The demand at its floor (or at `nbytes`, between its floor and its ceiling), with
    what it asked for and why it did not get it. A job's demand asks for what its
    consumer's job lease lacks: its floor likewise."""
    floor = demand.floor
    assert floor is not None
    if nbytes is not None:
        floor = max(floor, min(nbytes, demand.job_bytes or demand.envelope))
    if demand.job_bytes is not None:
        held = demand.job_bytes - demand.envelope
        degraded = Degraded(floor, demand.job_bytes, reason, why)
        return attrs.evolve(
            demand, envelope=max(0, floor - held), job_bytes=floor, floor=None, degraded=degraded
        )
    degraded = Degraded(floor, demand.envelope, reason, why)
    return attrs.evolve(demand, envelope=floor, floor=None, degraded=degraded)


def at_floor_note(demand: Demand) -> str:
    """For the failure of a demand planned at its floor: that it was, and why ("" for any
    other)."""
    degraded = demand.degraded
    if degraded is None:
        return ""
    return (
        f"; that is what it was degraded to: its ceiling of {format_gib(degraded.ceiling)} "
        f"met {degraded.reason.value}"
    )


def degraded_event(lease: Lease) -> Event:
    """`degraded`: a lease granted at its floor (`bytes`) for its ceiling (`ceiling`);
    `reason` is what the ceiling met."""
    degraded = lease.demand.degraded
    assert degraded is not None
    return Event(
        EventKind.DEGRADED,
        lease.granted,
        key=lease.key,
        gpu=lease.gpu,
        bytes=degraded.floor,
        ceiling=degraded.ceiling,
        reason=degraded.reason.value,
        priority=lease.demand.priority.label,
        lease=lease.id,
        detail=(
            f"granted {format_gib(degraded.floor)} of its {format_gib(degraded.ceiling)} "
            f"ceiling; the ceiling: {degraded.why}"
        ),
    )


def unallocated(budget: GpuBudget, but: str | None = None) -> list[tuple[str, int]]:
    """Consumers (but `but`) with leased bytes on the card that NVML does not show yet, and
    how many: to a load that sizes itself those bytes look free."""
    rows = []
    for row in budget.consumers:
        if row.name == but or not row.pending:
            continue
        unseen = min(row.pending, row.resident + row.unexplained + row.pending - row.observed)
        if unseen > TOLERANCE:
            rows.append((row.name, unseen))
    return rows


ALLOCATING = "it sizes itself to the memory it sees free: waiting for leases not yet allocated"


def allocating(decision: Plan) -> bool:
    """Whether a wait is `await_allocations`'s."""
    return decision.kind is PlanKind.WAIT and decision.reason.startswith(ALLOCATING)


def await_allocations(demand: Demand, decision: Plan, budget: GpuBudget | None) -> Plan:
    """A grant to a load that sizes itself waits while another lease on its card is not
    allocated yet; any other decision stands. A job its runtime already runs
    (`Demand.started`) cannot be held back: it stands too."""
    if (
        demand.sizing is not Sizing.FITS_FREE
        or decision.kind is not PlanKind.GRANT
        or decision.needed <= 0
        or demand.started is not None
        or budget is None
    ):
        return decision
    # A consumer's jobs run one at a time in its one job lease: its own bytes there are the
    # job's. Any other load of its own (a router loading two models) is another lease.
    rows = unallocated(budget, demand.consumer if demand.scope is LeaseScope.JOB else None)
    if not rows:
        return decision
    names = ", ".join(f"{name} {format_gib(nbytes)}" for name, nbytes in rows)
    return Plan(
        PlanKind.WAIT,
        decision.needed,
        earliest=None,
        reason=f"{ALLOCATING} ({names})",
    )


def headroom(books: Books, gpu: int) -> int:
    """What self-sizing loads granted below their ceiling may still take on the GPU."""
    return sum(headroom_by_consumer(books, gpu).values())


def headroom_by_consumer(books: Books, gpu: int) -> dict[str, int]:
    """Per consumer, what its self-sizing loads granted below their ceiling may still take
    on the GPU: a request's until its load completes, a job's while its job lives (per job
    lease, the most any of its jobs may grow to beyond what it holds). Growth within it is
    what the gate granted for, not an overrun."""
    total: dict[str, int] = {}
    by_carrier: dict[int, int] = {}
    for lease in books.leases_on(gpu):
        demand = lease.demand
        degraded = demand.degraded
        if degraded is None or demand.sizing is not Sizing.FITS_FREE:
            continue
        if lease.job_of is not None:
            carrier = books.leases.get(lease.job_of)
            held = carrier.pending if carrier is not None else 0
            grow = max(0, degraded.ceiling - held)
            by_carrier[lease.job_of] = max(by_carrier.get(lease.job_of, 0), grow)
        elif lease.scope is not LeaseScope.JOB and lease.pending > 0:
            consumer = lease.key.consumer
            total[consumer] = total.get(consumer, 0) + max(0, degraded.ceiling - lease.pending)
    for carrier_id, grow in by_carrier.items():
        carrier = books.leases.get(carrier_id)
        if carrier is not None:
            consumer = carrier.key.consumer
            total[consumer] = total.get(consumer, 0) + grow
    return total


@attrs.define
class AfterLoads:
    """Self-sizing loads granted below their ceiling that completed: what each may have
    taken beyond its lease stays held until a sample taken after it shows it."""

    held: dict[int, list[tuple[float, int]]] = attrs.field(factory=dict)
    """GPU → (completed at, bytes it may have taken beyond its lease)."""

    def completed(self, lease: Lease, now: float) -> None:
        """The lease's load completed (before its bytes become a resident's)."""
        degraded = lease.demand.degraded
        if degraded is None or lease.demand.sizing is not Sizing.FITS_FREE or not lease.pending:
            return
        grow = max(0, degraded.ceiling - lease.pending)
        if grow:
            self.held.setdefault(lease.gpu, []).append((now, grow))

    def on(self, gpu: int, sampled_at: float | None) -> int:
        """What is still held on the GPU, given its last sample's time (entries a sample
        after them has shown are dropped)."""
        entries = self.held.get(gpu)
        if not entries:
            return 0
        if sampled_at is not None:
            entries[:] = [(at, nbytes) for at, nbytes in entries if at >= sampled_at]
        return sum(nbytes for _, nbytes in entries)
