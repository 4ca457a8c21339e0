"""Leases that outlive a request beyond a job's (`gpugate.core.job_leases`): processes, and
memory known from NVML only.

PROCESS: a process that allocates at start. Its lease loads a resident like a request's;
it turns into that resident once NVML shows the consumer holding the lease's bytes, and
fails if that does not happen within the demand's `appear_within`. A switch of a running
process's model (`Demand.switch`) is not watched here: the runtime's answer ends it.

Memory known from NVML only (a process resident, or what a runtime that cannot list kept
after its jobs) is a resident whose bytes follow what NVML shows for its consumer.
"""

from __future__ import annotations

from gpugate.core.books import Books
from gpugate.core.effects import Effect, Event, EventKind
from gpugate.core.failures import Failure, FailureClass
from gpugate.core.job_leases import JobLease, job_bytes
from gpugate.core.listing import resident_event
from gpugate.core.observation import GpuObservation
from gpugate.core.residents import Resident, ResidentKey, ResidentState
from gpugate.core.tickets import Demand, Lease, LeaseScope

HELD_MODEL = "<held>"
"""The resident for memory a runtime that cannot list kept after its jobs."""
PROCESS_APPEARED = 0.75
"""A process lease is a resident once NVML shows this fraction of its bytes."""


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
