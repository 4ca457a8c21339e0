"""Lease scopes in the core: a consumer's job lease, and process leases."""

from __future__ import annotations

import attrs

from gpugate.core.classes import PriorityClass as P
from gpugate.core.classes import ResidencyPolicy
from gpugate.core.effects import EventKind, Grant, Unload
from gpugate.core.failures import FailureClass
from gpugate.core.job_leases import JOBS_MODEL
from gpugate.core.listing import ListedModel
from gpugate.core.residents import ResidentKey
from gpugate.core.scopes import HELD_MODEL
from gpugate.core.tickets import LeaseScope
from gpugate.core.units import GiB
from tests.core.builders import RESERVED, TOTAL, demand, gpu, host, make_core, proc

C = "comfy"


def job(nbytes, **kw):
    return attrs.evolve(demand("workflow", nbytes, consumer=C, **kw), scope=LeaseScope.JOB)


def core_with(*processes, reconcilable=()):
    core = make_core(consumers=(C, "ollama"), reconcilable=reconcilable)
    core.observe(host(gpu(*processes), at=0.0), 0.0)
    return core


def carrier(core):
    found = [x for x in core.leases() if x.key.model == JOBS_MODEL]
    assert len(found) <= 1
    return found[0] if found else None


def test_jobs_share_one_lease_sized_to_the_largest():
    core = core_with()
    first = core.submit(job(4 * GiB), 0.0).lease
    assert first is not None and first.scope is LeaseScope.JOB and first.pending == 0
    assert carrier(core).pending == 4 * GiB
    # Fits within: granted at once, 0 bytes more.
    second = core.submit(job(3 * GiB), 1.0)
    assert second.lease is not None
    assert carrier(core).pending == 4 * GiB
    # Bigger: grows by the difference through the planner.
    third = core.submit(job(6 * GiB), 2.0)
    assert third.lease is not None
    assert carrier(core).pending == 6 * GiB
    rows = {row.name: row for row in core.budget(0).consumers}
    assert rows[C].pending == 6 * GiB
    # The largest ends: the lease shrinks to the largest left, and ends with the last.
    core.job_events.job_done(C, third.lease.id, 3.0)
    assert carrier(core).pending == 4 * GiB
    core.job_events.job_done(C, first.id, 4.0)
    assert carrier(core).pending == 3 * GiB
    effects = core.job_events.job_done(C, second.lease.id, 5.0)
    assert carrier(core) is None and core.leases() == []
    reasons = [e.reason for e in effects if e.kind is EventKind.LEASE_RELEASED]
    assert reasons == ["done", "jobs done"]


def test_a_job_ends_by_the_runtimes_name_for_it_and_a_release_ends_it_too():
    core = core_with()
    a = core.submit(job(2 * GiB), 0.0).lease
    b = core.submit(job(2 * GiB), 0.0).lease
    assert core.job_events.job_started(a.id, "prompt-a")
    assert core.job_events.job_done(C, "prompt-a", 1.0) != []
    assert core.job_events.job_done(C, "prompt-a", 1.0) == []  # already over
    assert core.job_events.job_done("ollama", b.id, 1.0) == []  # not that consumer's
    # The runtime refused the job's request: the caller releases its lease.
    core.release(b.id, 2.0, failed=True)
    assert core.leases() == []


def test_a_growth_that_must_wait_asks_only_for_what_is_missing_when_granted():
    # 16 GiB card: 434 MiB reserved, 1 GiB reserve, 5 GiB held by something external.
    core = core_with(proc(500, 5 * GiB, "plex", managed=False))
    busy = core.submit(demand("llama", 3 * GiB, priority=P.BACKGROUND), 0.0).lease
    small = core.submit(job(4 * GiB), 0.0).lease
    big = core.submit(job(8 * GiB), 1.0)
    assert big.waiting
    assert core.waiting()[0].demand.envelope == 4 * GiB
    # The small job ends: its lease goes, so the waiting job now needs all of its 8 GiB.
    core.job_events.job_done(C, small.id, 2.0)
    assert carrier(core) is None
    assert core.waiting()[0].demand.envelope == 8 * GiB
    core.loaded(busy.id, 2.5)
    effects = core.release(busy.id, 3.0)
    unload = next(e for e in effects if isinstance(e, Unload))
    effects = core.unloaded(unload.key, 4.0, reclaimed=True)
    grant = next(e for e in effects if isinstance(e, Grant))
    assert grant.ticket_id == big.ticket_id
    assert carrier(core).pending == 8 * GiB
    budget = core.budget(0)
    assert budget.committed_total + budget.external_total + budget.reserve + RESERVED <= TOTAL


def lease_events(effects, kind):
    return [(e.model, e.bytes, e.reason) for e in effects if getattr(e, "kind", None) is kind]


def test_a_jobs_events_say_its_own_size_and_nothing_counts_it_twice():
    core = core_with()
    first = core.submit(job(4 * GiB), 0.0)
    # Fits within the job lease: it grows by nothing, yet the job's event says its 3 GiB.
    second = core.submit(job(3 * GiB), 1.0)
    # Bigger: grows the job lease by 2 GiB through the planner; its event says its 6 GiB.
    third = core.submit(job(6 * GiB), 2.0)
    granted = [lease_events(x.effects, EventKind.LEASE_GRANTED)[0] for x in (first, second, third)]
    assert [(model.startswith("job-"), nbytes) for model, nbytes, _ in granted] == [
        (True, 4 * GiB),
        (True, 3 * GiB),
        (True, 6 * GiB),
    ]
    # The bytes are counted once, on the job lease: the leases' own stay 0.
    assert [x.pending for x in (first.lease, second.lease, third.lease)] == [0, 0, 0]
    assert {row.name: row.pending for row in core.budget(0).consumers}[C] == 6 * GiB
    ended = core.job_events.job_done(C, third.lease.id, 3.0)
    assert lease_events(ended, EventKind.LEASE_RELEASED) == [
        (third.lease.key.model, 6 * GiB, "done")
    ]
    core.job_events.job_done(C, first.lease.id, 4.0)
    ended = core.job_events.job_done(C, second.lease.id, 5.0)
    assert lease_events(ended, EventKind.LEASE_RELEASED) == [
        (second.lease.key.model, 3 * GiB, "done"),
        (JOBS_MODEL, 3 * GiB, "jobs done"),
    ]


def test_a_growth_granted_after_waiting_says_the_jobs_size():
    core = core_with(proc(500, 5 * GiB, "plex", managed=False))
    busy = core.submit(demand("llama", 3 * GiB, priority=P.BACKGROUND), 0.0).lease
    small = core.submit(job(4 * GiB), 0.0).lease
    big = core.submit(job(8 * GiB), 1.0)
    assert lease_events(big.effects, EventKind.LEASE_GRANTED) == []
    core.job_events.job_done(C, small.id, 2.0)
    core.loaded(busy.id, 2.5)
    unload = next(e for e in core.release(busy.id, 3.0) if isinstance(e, Unload))
    effects = core.unloaded(unload.key, 4.0, reclaimed=True)
    [(model, nbytes, _)] = lease_events(effects, EventKind.LEASE_GRANTED)
    assert (model.startswith("job-"), nbytes) == (True, 8 * GiB)


def test_memory_kept_after_the_last_job_is_a_resident_known_from_nvml():
    core = core_with()
    lease = core.submit(job(6 * GiB), 0.0).lease
    core.observe(host(gpu(proc(10, 5 * GiB, C)), at=1.0), 1.0)
    core.job_events.job_done(C, lease.id, 2.0)
    held = core.resident(ResidentKey(C, HELD_MODEL))
    assert held is not None and held.bytes == 5 * GiB and held.tracks_observed and held.idle
    # The runtime frees some on its own: the resident follows; all of it: the resident goes.
    core.observe(host(gpu(proc(10, 2 * GiB, C)), at=3.0), 3.0)
    assert core.resident(ResidentKey(C, HELD_MODEL)).bytes == 2 * GiB
    effects = core.observe(host(gpu(), at=4.0), 4.0)
    assert core.resident(ResidentKey(C, HELD_MODEL)) is None
    assert [e.kind for e in effects if e.kind is EventKind.RESIDENT_GONE]


def test_a_runtime_that_lists_names_what_it_kept_itself():
    core = core_with(reconcilable=(C,))
    lease = core.submit(job(6 * GiB), 0.0).lease
    core.observe(host(gpu(proc(10, 5 * GiB, C)), at=1.0), 1.0)
    core.job_events.job_done(C, lease.id, 2.0)
    assert core.residents() == []
    assert core.telemetry.unexplained[0][C] == 5 * GiB


def test_the_resident_kept_after_jobs_is_evicted_like_any_other():
    core = core_with()
    lease = core.submit(job(6 * GiB, ttl=10.0), 0.0).lease
    core.observe(host(gpu(proc(10, 5 * GiB, C)), at=1.0), 1.0)
    core.job_events.job_done(C, lease.id, 2.0)
    effects = core.tick(13.0)
    unloads = [e for e in effects if isinstance(e, Unload)]
    assert [u.key for u in unloads] == [ResidentKey(C, HELD_MODEL)]


def process(nbytes, within=30.0):
    return attrs.evolve(
        demand("whisper", nbytes, consumer=C), scope=LeaseScope.PROCESS, appear_within=within
    )


def test_a_process_lease_becomes_a_resident_when_nvml_shows_its_memory():
    core = core_with()
    lease = core.submit(process(2 * GiB), 0.0).lease
    assert lease is not None and lease.appear_by == 30.0
    core.observe(host(gpu(proc(10, 1 * GiB, C)), at=1.0), 1.0)
    assert core.lease(lease.id) is not None  # half of it: still starting
    effects = core.observe(host(gpu(proc(10, 2 * GiB, C)), at=2.0), 2.0)
    assert core.leases() == []
    resident = core.resident(lease.key)
    assert resident.bytes == 2 * GiB and resident.idle and resident.tracks_observed
    assert [e.reason for e in effects if e.kind is EventKind.LEASE_RELEASED] == ["resident"]
    # The process exits: NVML shows nothing, and the resident goes.
    core.observe(host(gpu(), at=3.0), 3.0)
    assert core.residents() == []


def test_a_process_that_never_shows_its_memory_fails_its_lease():
    core = core_with()
    lease = core.submit(process(2 * GiB, within=5.0), 0.0).lease
    assert core.next_wakeup() == 5.0
    assert core.tick(4.0) == []
    effects = core.tick(5.0)
    failures = [e.failure for e in effects if e.kind is EventKind.FAILURE]
    assert [f.failure_class for f in failures] == [FailureClass.TIMEOUT]
    assert core.lease(lease.id) is None and core.leases() == [] and core.residents() == []


def listed(model, nbytes):
    return ListedModel(model, nbytes, nbytes, P.INTERACTIVE, ResidencyPolicy.KEEP_WARM, None)


def test_a_process_lease_whose_model_the_runtime_lists_is_a_resident_without_nvml():
    core = core_with(reconcilable=(C,))
    lease = core.submit(process(2 * GiB), 0.0).lease
    assert lease is not None
    # A listing asked before the grant says nothing of this load.
    core.reconcile(C, 0, [listed("whisper", 1 * GiB)], asked_at=-1.0, now=1.0)
    assert core.lease(lease.id) is not None
    effects = core.reconcile(C, 0, [listed("whisper", 1 * GiB)], asked_at=2.0, now=2.0)
    assert core.leases() == []
    assert [e.reason for e in effects if e.kind is EventKind.LEASE_RELEASED] == ["resident"]
    resident = core.resident(lease.key)
    # The runtime's word sizes it; NVML does not follow it as a process's memory.
    assert resident.bytes == 1 * GiB and not resident.tracks_observed
    # A listing without it: the model is gone.
    core.reconcile(C, 0, [], asked_at=3.0, now=3.0)
    assert core.residents() == []
