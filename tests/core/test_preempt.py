"""Preemption in the core: a demand of a class a job consumer's `preempt` lists may stop
its lower-class jobs, when nothing else makes it fit."""

from __future__ import annotations

import attrs

from gpugate.core.classes import PriorityClass as P
from gpugate.core.effects import Event, EventKind, Grant, Preempt, Reject, Unload
from gpugate.core.failures import Failure, FailureClass
from gpugate.core.job_leases import JOBS_MODEL
from gpugate.core.residents import ResidentKey
from gpugate.core.scopes import HELD_MODEL
from gpugate.core.tickets import LeaseScope
from gpugate.core.units import GiB, MiB
from tests.core.builders import demand, gpu, host, make_core, proc

C = "comfy"
HELD = ResidentKey(C, HELD_MODEL)


def job(nbytes, priority=P.INTERACTIVE):
    return attrs.evolve(
        demand("workflow", nbytes, consumer=C, priority=priority), scope=LeaseScope.JOB
    )


def running(*classes, job_priority=P.INTERACTIVE, name="p1"):
    """A core whose comfy consumer runs a 12 GiB job (11 GiB in NVML) named `name`."""
    core = make_core(consumers=(C, "ollama"))
    core.settings = attrs.evolve(core.settings, preempt={C: frozenset(classes)})
    core.observe(host(gpu(proc(10, 200 * MiB, C)), at=0.0), 0.0)
    lease = core.submit(job(12 * GiB, job_priority), 0.0).lease
    assert lease is not None
    if name is not None:
        assert core.job_events.job_started(lease.id, name)
    core.observe(host(gpu(proc(10, 11 * GiB, C)), at=1.0), 1.0)
    return core


def gemma(priority=P.PRODUCTION):
    return demand("gemma3:12b", 8 * GiB, priority=priority)


def of(effects, kind):
    return [e for e in effects if isinstance(e, kind)]


def failures(effects):
    return [e for e in of(effects, Event) if e.kind is EventKind.FAILURE]


def test_a_demand_of_a_listed_class_preempts_the_job_lease_then_evicts_what_is_left():
    core = running(P.PRODUCTION)
    admission = core.submit(gemma(), 2.0)
    assert admission.waiting
    [preempt] = of(admission.effects, Preempt)
    assert preempt == Preempt(C, 0, ("p1",), 12 * GiB, admission.ticket_id)
    [started] = [e for e in of(admission.effects, Event) if e.kind is EventKind.PREEMPTION_STARTED]
    assert started.consumer == C and started.bytes == 12 * GiB
    assert "jobs p1 of comfy for ollama/gemma3:12b (production)" in started.detail
    assert started.schedulable_before is not None and started.schedulable_before < 8 * GiB
    # Planned again while the runtime is asked: no second preemption.
    again = core.observe(host(gpu(proc(10, 11 * GiB, C)), at=2.5), 2.5) + core.tick(3.0)
    assert of(again, Preempt) == []
    assert [t.id for t in core.waiting()] == [admission.ticket_id]

    effects = core.job_events.preempted(C, 0, ["p1"], 3.0)
    [stopped] = failures(effects)
    assert stopped.failure.failure_class is FailureClass.RESIDENCY_CONFLICT
    assert "comfy's job p1 (interactive) was preempted for ollama/gemma3:12b (production)" in (
        stopped.failure.message
    )
    assert [x for x in core.leases() if x.key.consumer == C] == []
    # What ComfyUI kept (11 GiB beyond its context) is a resident, evicted for the demand.
    [unload] = of(effects, Unload)
    assert unload.key == HELD and unload.for_ticket == admission.ticket_id
    assert of(effects, Grant) == []
    core.observe(host(gpu(proc(10, 200 * MiB, C)), at=4.0), 4.0)
    [grant] = of(core.unloaded(HELD, 4.0, reclaimed=True), Grant)
    assert grant.ticket_id == admission.ticket_id and grant.lease.pending == 8 * GiB
    assert core.waiting() == []


def test_without_preempt_a_running_job_is_never_stopped():
    core = running()
    admission = core.submit(gemma(), 2.0)
    assert of(admission.effects, Preempt) == []
    assert admission.failure is not None
    assert admission.failure.failure_class is FailureClass.INSUFFICIENT_SCHEDULABLE_VRAM
    assert [x.key.model for x in core.leases() if x.key.consumer == C] == [JOBS_MODEL, "job-1"]


def test_only_a_listed_class_and_only_lower_class_jobs_are_preempted():
    # Interactive is not listed.
    core = running(P.PRODUCTION)
    assert of(core.submit(gemma(P.INTERACTIVE), 2.0).effects, Preempt) == []
    # A production job is not lower than a production demand.
    core = running(P.PRODUCTION, job_priority=P.PRODUCTION)
    assert of(core.submit(gemma(), 2.0).effects, Preempt) == []
    # A job the runtime has not named yet cannot be stopped there.
    core = running(P.PRODUCTION, name=None)
    assert of(core.submit(gemma(), 2.0).effects, Preempt) == []


def test_a_demand_that_fits_otherwise_preempts_nothing():
    core = running(P.PRODUCTION)
    admission = core.submit(demand("llama3.2:3b", 2 * GiB, priority=P.PRODUCTION), 2.0)
    assert admission.lease is not None
    assert of(admission.effects, Preempt) == []


def test_a_runtime_that_cannot_be_asked_fails_the_ticket_and_its_jobs_go_on():
    core = running(P.PRODUCTION)
    admission = core.submit(gemma(), 2.0)
    crash = Failure(FailureClass.RUNTIME_CRASH, "RUNTIME_CRASH: comfy did not answer")
    effects = core.job_events.preempted(C, 0, ["p1"], 3.0, failure=crash)
    [reject] = of(effects, Reject)
    assert reject.ticket_id == admission.ticket_id
    assert reject.failure.failure_class is FailureClass.RUNTIME_CRASH
    assert core.waiting() == []
    assert [x.key.model for x in core.leases() if x.key.consumer == C] == [JOBS_MODEL, "job-1"]
