"""JOB leases: work a runtime queues and runs after the request that asked for it returned.

A runtime whose jobs run one at a time needs the memory of its largest job, not the sum.
Its consumer holds one job lease per GPU, sized to its largest live job; each job has a
lease of its own that carries no bytes. A job that fits in the job lease is granted at
once; a bigger one asks the planner for the difference and grows it. When a job ends the
job lease shrinks to the largest job left, and it ends with the last one.
"""

from __future__ import annotations

import attrs

from gpugate.core.books import Books
from gpugate.core.residents import ResidentKey
from gpugate.core.tickets import Demand, Lease, LeaseScope, Ticket

JOBS_MODEL = "<jobs>"
"""The name a consumer's job lease goes by where a model's name would be."""


def job_model(job_id: int) -> str:
    """The name a job goes by where a model's name would be (`job-7`): unique, so no
    job rides on another's ticket."""
    return f"job-{job_id}"


@attrs.define
class JobLease:
    """A consumer's one lease for its jobs on a GPU."""

    lease: Lease
    """The lease in the books that carries the bytes (as `pending`)."""
    last: Demand
    """The latest job's demand: the class and policy of what stays after the jobs."""
    jobs: dict[int, int] = attrs.field(factory=dict)
    """Live jobs: their lease's id → their size."""
    names: dict[str, list[int]] = attrs.field(factory=dict)
    """The runtime's names of jobs → their leases' ids, oldest first (a runtime may take a
    name twice: ComfyUI queues two prompts sent with the same `prompt_id`)."""
    preempted_for: int | None = None
    """The ticket its jobs are being stopped for (`Preempt`), until they end."""

    @property
    def bytes(self) -> int:
        return self.lease.pending

    def largest(self) -> int:
        return max(self.jobs.values(), default=0)


class JobBook:
    """The job leases, kept with the books they change."""

    def __init__(self, books: Books) -> None:
        self.books = books
        self.by_consumer: dict[tuple[str, int], JobLease] = {}
        self.carriers: dict[int, JobLease] = {}

    def held(self, consumer: str, gpu: int) -> int:
        """Bytes of the consumer's job lease on a GPU (0: none)."""
        pool = self.by_consumer.get((consumer, gpu))
        return 0 if pool is None else pool.bytes

    def open(self, job_id: int, demand: Demand, now: float, arrived: float) -> Lease:
        """Record a granted job; its consumer's job lease starts or grows to cover it."""
        books = self.books
        size = demand.job_bytes if demand.job_bytes is not None else demand.envelope
        pool = self.by_consumer.get((demand.consumer, demand.gpu))
        if pool is None:
            carrier_demand = attrs.evolve(
                demand, key=ResidentKey(demand.consumer, JOBS_MODEL), envelope=size, job_bytes=None
            )
            carrier = Lease(
                books.new_id(), carrier_demand, granted=now, waited=0.0, pending=0, loads=False
            )
            books.leases[carrier.id] = carrier
            pool = JobLease(carrier, demand)
            self.by_consumer[(demand.consumer, demand.gpu)] = pool
            self.carriers[carrier.id] = pool
        pool.lease.pending = max(pool.lease.pending, size)
        pool.jobs[job_id] = size
        pool.last = demand
        lease = Lease(
            job_id,
            demand,
            granted=now,
            waited=now - arrived,
            pending=0,
            loads=False,
            job_of=pool.lease.id,
        )
        books.leases[job_id] = lease
        books.touch()
        return lease

    def name(self, job_id: int, job: str) -> bool:
        """The runtime named a job (its id in the runtime's own queue)."""
        lease = self.books.leases.get(job_id)
        if lease is None or lease.job_of is None:
            return False
        self.carriers[lease.job_of].names.setdefault(job, []).append(job_id)
        return True

    def find(self, consumer: str, job: int | str) -> int | None:
        """A job's lease id, by that id or by the runtime's name for the job."""
        if isinstance(job, int):
            lease = self.books.leases.get(job)
            ok = lease is not None and lease.job_of is not None and lease.key.consumer == consumer
            return job if ok else None
        for (owner, _), pool in self.by_consumer.items():
            if owner == consumer and job in pool.names:
                return pool.names[job][0]
        return None

    def close(self, job_id: int) -> tuple[Lease, JobLease, bool] | None:
        """A job ended: its lease goes, and its job lease shrinks or (last job) ends."""
        lease = self.books.leases.get(job_id)
        if lease is None or lease.job_of is None:
            return None
        del self.books.leases[job_id]
        pool = self.carriers[lease.job_of]
        pool.jobs.pop(job_id, None)
        for name, ids in list(pool.names.items()):
            if job_id in ids:
                ids.remove(job_id)
                if not ids:
                    del pool.names[name]
        ended = not pool.jobs
        if ended:
            del self.books.leases[pool.lease.id]
            del self.carriers[pool.lease.id]
            del self.by_consumer[(lease.key.consumer, lease.gpu)]
        else:
            pool.lease.pending = pool.largest()
        self.books.touch()
        return lease, pool, ended

    def resize_waiting(self, tickets: list[Ticket]) -> None:
        """Waiting jobs ask for what their consumer's job lease lacks now, no more, no less."""
        changed = False
        for ticket in tickets:
            demand = ticket.demand
            if demand.scope is not LeaseScope.JOB or demand.job_bytes is None:
                continue
            grow = max(0, demand.job_bytes - self.held(demand.consumer, demand.gpu))
            if grow != demand.envelope:
                ticket.demand = attrs.evolve(demand, envelope=grow)
                changed = True
        if changed:
            self.books.touch(residents=False)


def job_demand(demand: Demand, job_id: int, held: int) -> Demand:
    """A job's demand as the queue sees it: a unique key, and the bytes it grows by."""
    size = demand.envelope if demand.job_bytes is None else demand.job_bytes
    return attrs.evolve(
        demand,
        key=ResidentKey(demand.consumer, job_model(job_id)),
        envelope=max(0, size - held),
        job_bytes=size,
    )


def job_bytes(lease: Lease) -> int | None:
    """The bytes a person reads for a lease of JOB scope: a job's own size (its consumer's
    job lease carries them, so its own `pending` is 0), or the job lease's bytes; None for
    a lease of another scope. Shown on events only: whatever sums bytes reads `pending`."""
    if lease.job_of is not None:
        demand = lease.demand
        return demand.envelope if demand.job_bytes is None else demand.job_bytes
    if lease.scope is LeaseScope.JOB:
        return lease.pending
    return None
