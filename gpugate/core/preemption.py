"""Preemption: a demand may stop a consumer's jobs, when that consumer lets its class.

A running job is never a victim by default: its lease is live, like a request in flight.
A job runtime's consumer may list classes (`preempt`) whose demands may stop its jobs
instead: the running one interrupted, the pending ones deleted. The planner turns to that
only when the demand cannot have its bytes otherwise (what is free, idle residents it may
evict, unloads under way) and the job leases it may stop would make up the rest; and only
jobs of a lower class than the demand's, all of them named by their runtime (a job still
on its way to the runtime cannot be stopped there).

Stopping the jobs ends them; what the runtime keeps afterwards becomes a resident known
from NVML, which the demand then evicts like any other, verified the same way.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable

from gpugate.core.books import Books
from gpugate.core.classes import PriorityClass
from gpugate.core.job_leases import JobLease
from gpugate.core.planner import PlannerSettings
from gpugate.core.residents import ResidentKey
from gpugate.core.tickets import Demand
from gpugate.core.views import ResidentView

PreemptClasses = Callable[[str], frozenset[PriorityClass]]
"""A consumer's name → the classes whose demands may stop its jobs."""


def preemptible(pool: JobLease, books: Books, demand: Demand, classes: PreemptClasses) -> bool:
    """May this demand stop the jobs of this job lease?"""
    consumer = pool.lease.key.consumer
    if (
        consumer == demand.consumer
        or pool.lease.gpu != demand.gpu
        or pool.preempted_for is not None
        or demand.priority not in classes(consumer)
        or len(pool.names) < len(pool.jobs)
    ):
        return False
    for job_id in pool.jobs:
        job = books.leases.get(job_id)
        if job is not None and max(job.demand.priority, job.demand.resident_priority) >= (
            demand.priority
        ):
            return False
    return True


def choose_preemption(
    demand: Demand,
    *,
    pool: int,
    view: ResidentView,
    claimed: Collection[ResidentKey],
    job_leases: Iterable[JobLease],
    books: Books,
    classes: PreemptClasses,
    now: float,
    settings: PlannerSettings,
) -> list[JobLease]:
    """The job leases to stop so that the demand fits, lowest class and largest first;
    none when it fits without them or would not fit even with them."""
    freeable = sum(r.bytes for r in view.unloading if r.key not in claimed)
    freeable += sum(r.bytes for r in view.evictable(demand) if r.key not in claimed)
    have = pool + freeable
    if have >= demand.envelope:
        return []
    candidates = sorted(
        (p for p in job_leases if preemptible(p, books, demand, classes)),
        key=lambda p: (_job_class(p, books), -p.bytes, p.lease.id),
    )
    chosen = []
    for candidate in candidates:
        chosen.append(candidate)
        have += candidate.bytes
        if have >= demand.envelope:
            return chosen
    return []


def _job_class(pool: JobLease, books: Books) -> int:
    classes = [books.leases[j].demand.priority for j in pool.jobs if j in books.leases]
    return int(max(classes, default=PriorityClass.MAINTENANCE))
