"""Leases that outlive a request: jobs and processes.

JOB: a runtime that queues work and runs it after the request that asked for it returned
(its jobs running one at a time) needs the memory of its largest job, not the sum. Its
consumer holds one job lease per GPU, sized to its largest live job; each job has a lease
of its own that carries no bytes. A job that fits in the job lease is granted at once; a
bigger one asks the planner for the difference and grows it. When a job ends the job lease
shrinks to the largest job left, and it ends with the last one.

PROCESS: a process that allocates at start. Its lease loads a resident like a request's;
it turns into that resident once NVML shows the consumer holding the lease's bytes, and
fails if that does not happen within the demand's `appear_within`. A switch of a running
process's model (`Demand.switch`) is not watched here: the runtime's answer ends it.

Memory known from NVML only (a process resident, or what a runtime that cannot list kept
after its jobs) is a resident whose bytes follow what NVML shows for its consumer.
"""

from __future__ import annotations

import attrs

from gpugate.core.books import Books
from gpugate.core.effects import Effect, Event, EventKind
from gpugate.core.failures import Failure, FailureClass
from gpugate.core.listing import resident_event
from gpugate.core.observation import GpuObservation
from gpugate.core.residents import Resident, ResidentKey, ResidentState
from gpugate.core.tickets import Demand, Lease, LeaseScope, Ticket

JOBS_MODEL = "<jobs>"
"""The name a consumer's job lease goes by where a model's name would be."""
HELD_MODEL = "<held>"
"""The resident for memory a runtime that cannot list kept after its jobs."""
PROCESS_APPEARED = 0.75
"""A process lease is a resident once NVML shows this fraction of its bytes."""


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


def released_event(lease: Lease, now: float, reason: str) -> Event:
    return Event(
        EventKind.LEASE_RELEASED,
        now,
        key=lease.key,
        gpu=lease.gpu,
        bytes=job_bytes(lease),
        wait=lease.waited,
        reason=reason,
        lease=lease.id,
    )


def left_behind(
    books: Books, pool: JobLease, observation: GpuObservation | None, now: float
) -> list[Event]:
    """What a runtime that cannot list kept after its last job, as a resident NVML tracks."""
    kept = keep_held(books, pool.last, pool.lease.gpu, observation, now)
    if kept is None:
        return []
    detail = "kept by its runtime after its last job"
    return [resident_event(EventKind.OUT_OF_BAND_RESIDENT, now, kept, detail)]


def keep_held(
    books: Books, demand: Demand, gpu: int, observation: GpuObservation | None, now: float
) -> Resident | None:
    """What NVML shows `demand`'s consumer holding on `gpu` beyond the books, added to its
    `<held>` resident (made with the demand's class and policy); None when there is none
    (or its `<held>` is not idle in the books)."""
    if observation is None:
        return None
    held = observation.managed.get(demand.consumer, 0) - accounted(books, demand.consumer, gpu)
    if held <= 0:
        return None
    key = ResidentKey(demand.consumer, HELD_MODEL)
    resident = books.residents.get(key)
    if resident is not None:
        if resident.state is not ResidentState.RESIDENT:
            return None
        resident.bytes += held
        resident.last_used = resident.changed_at = now
    else:
        resident = books.residents[key] = Resident(
            key=key,
            gpu=gpu,
            bytes=held,
            priority=demand.resident_priority,
            policy=demand.policy,
            idle_ttl=demand.idle_ttl,
            last_used=now,
            changed_at=now,
            reload_seconds=demand.reload_seconds,
            tracks_observed=True,
        )
    books.touch()
    return resident


def accounted(books: Books, consumer: str, gpu: int, *, but: ResidentKey | None = None) -> int:
    """What the books hold for a consumer on a GPU: its residents and pending leases."""
    residents = sum(
        r.bytes
        for r in books.residents.values()
        if r.key.consumer == consumer
        and r.gpu == gpu
        and r.key != but
        and r.state is not ResidentState.LOADING
    )
    pending = sum(
        x.pending for x in books.leases.values() if x.key.consumer == consumer and x.gpu == gpu
    )
    return residents + pending


def appeared(books: Books, observation: GpuObservation) -> list[Lease]:
    """Process leases whose process now shows (most of) their bytes in NVML."""
    found = []
    for lease in books.leases_on(observation.index):
        if lease.scope is not LeaseScope.PROCESS or not lease.pending or lease.demand.switch:
            continue
        consumer = lease.key.consumer
        others = sum(
            r.bytes
            for r in books.residents.values()
            if r.key.consumer == consumer
            and r.gpu == lease.gpu
            and r.key != lease.key
            and r.state is not ResidentState.LOADING
        )
        if observation.managed.get(consumer, 0) - others >= PROCESS_APPEARED * lease.pending:
            found.append(lease)
    return found


def follow_observed(books: Books, observation: GpuObservation, now: float) -> list[Event]:
    """Residents known from NVML only shrink to what it shows, and go when it shows none; a
    process's resident also grows to it (a process adopted while it held its memory), and
    stays while NVML has never shown any of it (a process that allocates nothing there)."""
    events: list[Event] = []
    for resident in list(books.on_gpu(observation.index)):
        if not resident.tracks_observed or not resident.idle:
            continue
        consumer = resident.key.consumer
        room = observation.managed.get(consumer, 0) - accounted(
            books, consumer, resident.gpu, but=resident.key
        )
        if resident.process and room > 0:
            resident.shown = True
        if room >= resident.bytes:
            if room > resident.bytes and resident.key.model != HELD_MODEL:
                resident.bytes = room
                books.touch()
            continue
        if room <= 0 and resident.process and not resident.shown:
            resident.bytes = 0
        elif room <= 0 and resident.key.model == HELD_MODEL and pending_for(books, resident):
            # A job lease now counts what the runtime kept: the memory is still there,
            # it is the job's (its lease says so), so nothing is reported gone.
            del books.residents[resident.key]
        elif room <= 0:
            del books.residents[resident.key]
            events.append(gone_event(resident, now, "NVML no longer shows its memory"))
        else:
            resident.bytes = room
        books.touch()
    return events


def gone_event(resident: Resident, now: float, detail: str) -> Event:
    """The event of a resident whose memory left without an unload of the gate's."""
    return Event(
        EventKind.RESIDENT_GONE,
        now,
        key=resident.key,
        gpu=resident.gpu,
        bytes=resident.bytes,
        detail=detail,
    )


def pending_for(books: Books, resident: Resident) -> int:
    """Bytes of the resident's consumer's leases still waiting for NVML on its GPU."""
    return sum(
        x.pending
        for x in books.leases.values()
        if x.key.consumer == resident.key.consumer and x.gpu == resident.gpu
    )


def switched(books: Books, lease: Lease, now: float) -> list[Event]:
    """A switch was answered: the process holds its new model and nothing else. Another
    model of the process still in the books (one it ran when the switch was queued, or
    since) was freed by the runtime for it."""
    events: list[Event] = []
    for resident in list(books.residents.values()):
        if (
            resident.key.consumer != lease.key.consumer
            or resident.gpu != lease.gpu
            or not resident.process
            or resident.key == lease.key
            or resident.state not in (ResidentState.RESIDENT, ResidentState.SUSPECT)
        ):
            continue
        del books.residents[resident.key]
        events.append(gone_event(resident, now, f"the process switched to {lease.key.model}"))
    if events:
        books.touch()
    return events


def process_ended(books: Books, consumer: str, now: float, detail: str) -> list[Event]:
    """The consumer's process ended: its process residents go with it, and a switch under
    way has no model left to fall back on."""
    for lease_id, out in list(books.switched_out.items()):
        if out.key.consumer == consumer:
            del books.switched_out[lease_id]
    events: list[Event] = []
    for resident in list(books.residents.values()):
        if resident.key.consumer != consumer or not resident.process:
            continue
        # A suspect (a stop NVML did not confirm) goes too: the process that held it is gone.
        if resident.state not in (ResidentState.RESIDENT, ResidentState.SUSPECT):
            continue
        del books.residents[resident.key]
        events.append(gone_event(resident, now, detail))
    if events:
        books.touch()
    return events


def process_overdue(books: Books, now: float) -> list[Lease]:
    """Process leases whose process did not show its memory in time, oldest id first."""
    return sorted(
        (
            x
            for x in books.leases.values()
            if x.appear_by is not None and x.pending and x.appear_by <= now
        ),
        key=lambda x: x.id,
    )


def next_appearance(books: Books) -> float | None:
    times = [x.appear_by for x in books.leases.values() if x.appear_by is not None and x.pending]
    return min(times) if times else None


def never_appeared(lease: Lease, now: float) -> Event:
    """The failure event of a process lease whose memory never showed."""
    within = lease.demand.appear_within or 0.0
    failure = Failure(
        FailureClass.TIMEOUT,
        f"TIMEOUT: {lease.key} did not show its {lease.demand.envelope / 2**30:.1f} GiB in NVML "
        f"within {within:g}s of its start; its lease is released",
        consumer=lease.key.consumer,
        model=lease.key.model,
        gpu=lease.gpu,
        bytes_needed=lease.demand.envelope,
    )
    return Event(
        EventKind.FAILURE,
        now,
        key=lease.key,
        gpu=lease.gpu,
        failure=failure,
        detail=failure.message,
    )


def listed_scopes(
    books: Books, consumer: str, gpu: int, names: set[str], *, asked_at: float, now: float
) -> list[Effect]:
    """Process leases whose model the runtime now lists as loaded become residents: the
    runtime's own word that the load is done (a model loaded by a child it spawned, or on
    a device NVML does not see) settles it before NVML does. Only a listing asked after
    the grant says so."""
    effects: list[Effect] = []
    for lease in list(books.leases_on(gpu)):
        if (
            lease.scope is LeaseScope.PROCESS
            and lease.pending
            and not lease.demand.switch
            and lease.key.consumer == consumer
            and lease.key.model in names
            and lease.granted <= asked_at
        ):
            books.close_lease(lease.id, now, failed=False)
            effects.append(released_event(lease, now, "resident"))
    return effects


def observed_scopes(books: Books, observation: GpuObservation, now: float) -> list[Effect]:
    """Process leases whose memory appeared become residents (known from NVML, followed
    by it); residents known from NVML only follow it."""
    effects: list[Effect] = []
    for lease in appeared(books, observation):
        closed = books.close_lease(lease.id, now, failed=False)
        if closed is not None and closed[1] is not None:
            closed[1].tracks_observed = closed[1].process = True
        effects.append(released_event(lease, now, "resident"))
    effects.extend(follow_observed(books, observation, now))
    return effects
