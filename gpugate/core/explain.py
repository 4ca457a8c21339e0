"""Failure messages a person can act on, built from the budget and the residents."""

from __future__ import annotations

from collections.abc import Sequence

from gpugate.core.budget import GpuBudget
from gpugate.core.classes import ResidencyPolicy
from gpugate.core.failures import Failure, FailureClass
from gpugate.core.residents import Resident, ResidentState
from gpugate.core.tickets import Demand
from gpugate.core.units import GiB, format_gib
from gpugate.core.views import class_allows


def _gib1(nbytes: int) -> str:
    return f"{nbytes / GiB:.1f}"


def describe_external(budget: GpuBudget) -> str:
    """'external 3.2 GiB: plex 3.0, unattributed 0.2' (or 'no external use')."""
    if not budget.external_total:
        return "no external use"
    parts = ", ".join(f"{row.name} {_gib1(row.bytes)}" for row in budget.external if row.bytes)
    return f"external {format_gib(budget.external_total)}: {parts}"


def describe_pressure(budget: GpuBudget, residents: Sequence[Resident]) -> str:
    """What over-committed a GPU: out-of-band residents, unlisted use, external use."""
    parts = []
    stray: dict[str, list[Resident]] = {}
    for r in sorted(residents, key=lambda r: -r.bytes):
        if r.out_of_band and r.bytes:
            stray.setdefault(r.key.consumer, []).append(r)
    for consumer, found in sorted(stray.items()):
        models = ", ".join(f"{r.key.model} {_gib1(r.bytes)} GiB" for r in found)
        parts.append(f"out-of-band residents of {consumer}: {models}")
    for row in budget.consumers:
        if row.unexplained:
            parts.append(
                f"use of {row.name} its runtime has not listed: {_gib1(row.unexplained)} GiB"
            )
    if budget.external_total:
        parts.append(describe_external(budget))
    return "; ".join(parts) if parts else f"the reserve grew to {_gib1(budget.reserve)} GiB"


def can_ever_have(resident: Resident, demand: Demand) -> bool:
    """Whether the resident's memory can ever be the demand's: it is leaving, its class
    and policy let the demand evict it once idle, or it goes at its idle ttl."""
    return (
        resident.state is ResidentState.UNLOADING
        or class_allows(resident, demand)
        or resident.idle_ttl is not None
    )


def why_kept(resident: Resident, demand: Demand) -> str:
    """Why a resident's memory can never be the demand's."""
    if resident.policy is ResidencyPolicy.ALWAYS_WARM:
        return f"{resident.priority.label}, always_warm: yields only to production"
    return f"{resident.priority.label}, above {demand.priority.label} and kept with no idle ttl"


def describe_holder(resident: Resident, demand: Demand) -> str:
    """One holder with what it is to the demand: idle and evictable, busy, or kept."""
    if not can_ever_have(resident, demand):
        state = why_kept(resident, demand)
    elif resident.state is not ResidentState.RESIDENT:
        state = f"{resident.priority.label}, {resident.state.value}"
    elif not resident.idle:
        state = f"{resident.priority.label}, busy"
    elif class_allows(resident, demand):
        state = f"{resident.priority.label}, idle"
        if resident.priority == demand.priority:
            state += ", same class: evictable once idle a while"
    else:
        state = f"{resident.priority.label}, idle, above {demand.priority.label}: goes at its ttl"
    return f"{resident.key} {_gib1(resident.bytes)} GiB ({state})"


def describe_holders(demand: Demand, residents: Sequence[Resident]) -> str:
    """Who holds the memory the demand would need, and why it cannot have it now."""
    others = [r for r in residents if r.key != demand.key and r.bytes]
    lower = [r for r in others if r.priority < demand.priority]
    if not lower:
        holders = "nothing evictable below class " + demand.priority.label
    else:
        busy = [r for r in lower if not r.idle]
        pinned = [r for r in lower if r.idle and not class_allows(r, demand)]
        if busy:
            holders = "lower-class holders busy: " + ", ".join(
                f"{r.key} {_gib1(r.bytes)} GiB" for r in busy
            )
        elif pinned:
            holders = "lower-class holders pinned by policy: " + ", ".join(
                f"{r.key} {_gib1(r.bytes)} GiB" for r in pinned
            )
        else:
            idle = sum(r.bytes for r in lower)
            holders = f"idle lower-class holders ({format_gib(idle)}) are not enough"
    top = sorted(others, key=lambda r: -r.bytes)[:3]
    if top:
        holders += "; largest: " + ", ".join(describe_holder(r, demand) for r in top)
    return holders


def reach_of(demand: Demand, budget: GpuBudget, residents: Sequence[Resident]) -> int:
    """The bytes that could ever be freed for the demand: what is schedulable and what
    the residents it may evict or outlast hold."""
    others = (r for r in residents if r.key != demand.key and r.bytes)
    return max(0, budget.schedulable) + sum(r.bytes for r in others if can_ever_have(r, demand))


def describe_reach(
    demand: Demand, needed: int, budget: GpuBudget, residents: Sequence[Resident]
) -> str:
    """For a demand that can never fit: the bytes that could ever be freed for it, and
    who holds the rest (the real reason, whatever it is: a resident kept by its policy or
    class, leases with no known end, memory nothing explains, the reserve, external use,
    or a card too small)."""
    others = [r for r in residents if r.key != demand.key and r.bytes]
    ever = sorted((r for r in others if can_ever_have(r, demand)), key=lambda r: -r.bytes)
    kept = sorted((r for r in others if not can_ever_have(r, demand)), key=lambda r: -r.bytes)
    evictable = sum(r.bytes for r in ever)
    reach = reach_of(demand, budget, residents)
    short = f", {format_gib(needed - reach)} short" if needed > reach else ""
    head = f"at most {format_gib(reach)} could ever be freed for it{short}"
    if ever:
        names = ", ".join(f"{r.key} {_gib1(r.bytes)}" for r in ever[:3])
        head += (
            f" ({format_gib(evictable)} of it held by residents it may evict or outlast: {names})"
        )
    held = [describe_holder(r, demand) for r in kept[:3]]
    loading = {}
    for r in residents:
        if r.state is ResidentState.LOADING:
            loading[r.key.consumer] = loading.get(r.key.consumer, 0) + r.bytes
    for row in budget.consumers:
        leased = row.pending - loading.get(row.name, 0)
        if leased > 0:
            held.append(f"leases of {row.name} with no known end {_gib1(leased)} GiB")
        if row.unexplained:
            held.append(f"{row.name} beyond its leases {_gib1(row.unexplained)} GiB")
    held.append(f"the reserve {_gib1(budget.reserve)} GiB")
    held.append(describe_external(budget))
    if budget.reserved:
        held.append(f"the driver {_gib1(budget.reserved)} GiB")
    return f"{head}; the rest is held by: {', '.join(held)}"


RUNTIME_FAULTS = {
    FailureClass.RUNTIME_CRASH: "is not answering",
    FailureClass.TIMEOUT: "did not answer in time",
    FailureClass.INVALID_OUTPUT: "answered what the gate cannot use",
    FailureClass.MODEL_LOAD_FAILED: "could not load a model",
    FailureClass.HEALTHCHECK_FAILED: "is not healthy",
    FailureClass.ARTIFACT_CORRUPT: "has a corrupt artifact",
    FailureClass.CAPABILITY_UNAVAILABLE: "cannot do what was asked",
}
"""Failures of the runtime itself, and how its part is put: memory is not the cause."""


def explain(
    failure: FailureClass,
    demand: Demand,
    needed: int,
    budget: GpuBudget | None,
    residents: Sequence[Resident],
    extra: str = "",
) -> str:
    """One line: class, what was needed, what was schedulable, and who holds the rest; for
    a failure of the runtime itself (it could not unload what had to go first), the
    runtime's part instead: the budget did not decide it and would only mislead."""
    fault = RUNTIME_FAULTS.get(failure)
    if fault is not None:
        return f"{failure.value}: {demand.model} cannot be loaded: {demand.consumer} {fault}{extra}"
    head = f"{failure.value}: {demand.model} needs {format_gib(needed)}"
    if budget is None:
        return f"{head} on GPU {demand.gpu}, which has no current sample{extra}"
    schedulable = max(0, budget.schedulable)
    if failure is FailureClass.INSUFFICIENT_SCHEDULABLE_VRAM:
        reach = describe_reach(demand, needed, budget, residents)
        return f"{head}, {format_gib(schedulable)} schedulable on GPU {budget.gpu}; {reach}{extra}"
    return (
        f"{head}, {format_gib(schedulable)} schedulable on GPU {budget.gpu} "
        f"({describe_external(budget)}; {describe_holders(demand, residents)}){extra}"
    )


DEFAULT_RETRY_AFTER = {
    FailureClass.QUEUE_FULL: 5.0,
    FailureClass.LEASE_TIMEOUT: 10.0,
    FailureClass.INSUFFICIENT_SCHEDULABLE_VRAM: 30.0,
    FailureClass.SCHEDULER_STATE_STALE: 5.0,
    FailureClass.DRIVER_ERROR: 30.0,
    FailureClass.GPU_MEMORY_NOT_RECLAIMED: 10.0,
}


def make_failure(
    failure_class: FailureClass,
    demand: Demand,
    needed: int,
    budget: GpuBudget | None,
    residents: Sequence[Resident],
    *,
    retry_after: float | None = None,
    extra: str = "",
) -> Failure:
    """A failure for a demand, with its message and a Retry-After for capacity classes."""
    if retry_after is None and failure_class.is_capacity:
        retry_after = DEFAULT_RETRY_AFTER.get(failure_class, 5.0)
    return Failure(
        failure_class,
        explain(failure_class, demand, needed, budget, residents, extra),
        consumer=demand.consumer,
        model=demand.model,
        gpu=demand.gpu,
        bytes_needed=needed,
        bytes_schedulable=max(0, budget.schedulable) if budget else None,
        retry_after=retry_after,
    )


REFUSALS = {
    FailureClass.INSUFFICIENT_SCHEDULABLE_VRAM: "more than could ever be freed for it",
    FailureClass.DEADLINE_CANNOT_BE_MET: "the memory it needs frees up only after its maximum wait",
    FailureClass.LEASE_TIMEOUT: "it waited the most its class may",
    FailureClass.EVICTION_NOT_ALLOWED: "what holds the memory may not be evicted for it",
    FailureClass.EXTERNAL_GPU_PRESSURE: "external use took the memory",
    FailureClass.UNLEASED_GPU_USE: "the consumers hold more than their leases",
    FailureClass.GPU_MEMORY_NOT_RECLAIMED: "an unload did not give its memory back in time",
    FailureClass.SCHEDULER_STATE_STALE: "the GPU has no fresh NVML sample",
    FailureClass.DRIVER_ERROR: "NVML fails",
    FailureClass.START_BACKOFF: "its runtime's last starts failed: not started again yet",
    FailureClass.GPU_OOM: "the runtime ran out of GPU memory",
    FailureClass.QUEUE_FULL: "its consumer has as many requests waiting as its queue_limit",
}
"""Why a demand was refused, in a few words, by failure class (the message says the rest)."""


def refusal_line(failure: Failure) -> str:
    """A refusal in one line: its class, the model and what it needed, and why in a few
    words (the failure's message, which says who holds what, stays the long form)."""
    klass = failure.failure_class
    fault = RUNTIME_FAULTS.get(klass)
    what = failure.model or failure.consumer or "the request"
    if failure.bytes_needed:
        what += f" needs {format_gib(failure.bytes_needed)}"
        if failure.bytes_schedulable is not None:
            gpu = "" if failure.gpu is None else f" on GPU {failure.gpu}"
            what += f", {format_gib(failure.bytes_schedulable)} schedulable{gpu}"
    if fault is not None:
        return f"{klass.value}: {failure.consumer or what} {fault}"
    why = REFUSALS.get(klass)
    if why is None:
        # Its message is short and says it (a drain, a full queue, a lease conflict).
        first = failure.message.split("; ")[0]
        return first if first.startswith(klass.value) else f"{klass.value}: {first}"
    return f"{klass.value}: {what}: {why}"
