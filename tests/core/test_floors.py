"""Floor and ceiling leases, and loads that size themselves (`gpugate.core.floors`).

The demo's card with whisper-server warm: a FLUX graph whose lease would be 12.5 GiB, where
at most 12.1 GiB can ever be freed, is granted its floor (ComfyUI loads the UNET partially)
instead of INSUFFICIENT_SCHEDULABLE_VRAM; a demand without a floor is refused as before.
"""

from __future__ import annotations

import attrs

from gpugate.core.classes import PriorityClass
from gpugate.core.effects import Event, EventKind, Grant, Reject, Unload
from gpugate.core.failures import FailureClass
from gpugate.core.floors import headroom
from gpugate.core.residents import ResidentKey
from gpugate.core.tickets import LeaseScope, Sizing
from gpugate.core.units import GiB, MiB, format_gib
from tests.core.builders import demand, gpu, host, make_core, proc
from tests.core.test_refusal_reasons import whisper_warm_card

P = PriorityClass
CEILING = 12_800 * MiB
FLOOR = 6 * GiB


def busy_warm_card():
    """The demo's card with whisper warm and qwen2.5:7b and bge-m3 serving (their leases
    held): nothing more than what is free could be had now, so a degraded demand gets its
    floor (the most it could ever have is not to be had before its deadline)."""
    core, processes = whisper_warm_card()
    for name, nbytes, klass in (("qwen2.5:7b", 5700 * MiB, P.INTERACTIVE),
                                ("bge-m3", 2012 * MiB, P.BACKGROUND)):  # fmt: skip
        serving = core.submit(demand(name, nbytes, priority=klass), 60.0)
        assert serving.lease is not None, serving
    return core, processes


def flux(**changes):
    wanted = demand("job-3", CEILING, consumer="comfyui")
    return attrs.evolve(wanted, **{"floor": FLOOR, "sizing": Sizing.FITS_FREE, **changes})


def events(effects, kind: EventKind) -> list[Event]:
    return [e for e in effects if isinstance(e, Event) and e.kind is kind]


def finish_unloads(core, processes, effects, now):
    """Each unload's runner leaves NVML, then the gate confirms it."""
    done = []
    for victim in [e for e in effects if isinstance(e, Unload)]:
        processes = [p for p in processes if p.used != victim.bytes]
        done += core.observe(host(gpu(*processes), at=now), now)
        done += core.unloaded(victim.key, now, reclaimed=True)
    return processes, done


def test_a_ceiling_that_can_never_be_had_is_granted_the_most_it_could_ever_have():
    core, processes = whisper_warm_card()
    admission = core.submit(flux(), 60.0)
    assert admission.waiting, admission.failure
    # 12.5 GiB can never be had beside whisper (always_warm); 12.1 GiB can, once the idle
    # bge-m3 (background) and qwen2.5:7b (interactive, idle) are gone.
    victims = [e for e in admission.effects if isinstance(e, Unload)]
    assert sorted(v.key.model for v in victims) == ["bge-m3", "qwen2.5:7b"]
    (queued,) = events(admission.effects, EventKind.TICKET_QUEUED)
    assert FLOOR < queued.bytes < CEILING
    processes, effects = finish_unloads(core, processes, admission.effects, 61.0)
    (grant,) = [e for e in effects if isinstance(e, Grant)]
    assert grant.ticket_id == admission.ticket_id
    assert grant.lease.pending == queued.bytes
    assert format_gib(grant.lease.pending) == "12.1 GiB"
    degraded = grant.lease.demand.degraded
    assert degraded is not None and degraded.ceiling == CEILING
    assert degraded.floor == grant.lease.pending
    (event,) = events(effects, EventKind.DEGRADED)
    assert (event.bytes, event.ceiling, event.lease) == (queued.bytes, CEILING, grant.lease.id)
    assert event.reason == FailureClass.INSUFFICIENT_SCHEDULABLE_VRAM.value
    assert "granted 12.1 GiB of its 12.5 GiB ceiling" in event.detail
    assert "at most 12.1 GiB could ever be freed for it, 0.4 GiB short" in event.detail
    assert "whisper/large-v3-turbo 2.0 GiB (interactive, always_warm" in event.detail
    assert core.budget(0).schedulable >= 0
    core.release(grant.lease.id, 62.0)
    assert core.leases() == [] and core.waiting() == []


def test_a_demand_without_a_floor_is_never_degraded():
    core, _ = whisper_warm_card()
    admission = core.submit(flux(floor=None), 60.0)
    assert admission.failure is not None
    assert admission.failure.failure_class is FailureClass.INSUFFICIENT_SCHEDULABLE_VRAM
    assert not events(admission.effects, EventKind.DEGRADED)
    assert core.leases() == [] and core.waiting() == []


def test_a_floor_that_cannot_be_had_either_is_refused_saying_so_and_evicts_nothing():
    core, _ = whisper_warm_card()
    admission = core.submit(flux(floor=12_500 * MiB), 60.0)
    failure = admission.failure
    assert failure is not None
    assert failure.failure_class is FailureClass.INSUFFICIENT_SCHEDULABLE_VRAM
    assert failure.bytes_needed == CEILING
    assert "nor its floor of 12.2 GiB: cannot fit" in failure.message, failure.message
    assert not [e for e in admission.effects if isinstance(e, Unload)]
    assert core.leases() == [] and core.waiting() == []


def busy_card():
    """16 GiB, 1 GiB reserve: a busy 8 GiB background model, 6.6 GiB schedulable beside it
    (an interactive demand expects its memory as soon as its request ends)."""
    core = make_core(consumers=("ollama", "comfyui"), max_wait=30.0)
    core.observe(host(gpu(), at=0.0), 0.0)
    admission = core.submit(demand("big", 8 * GiB, priority=P.BACKGROUND), 0.0)
    assert admission.lease is not None
    core.loaded(admission.lease.id, 0.0)
    core.observe(host(gpu(proc(10, 8 * GiB, "ollama")), at=1.0), 1.0)
    return core, admission.lease


def test_at_its_deadline_a_demand_that_waited_for_its_ceiling_gets_its_floor_from_what_is_free():
    core, busy = busy_card()
    # 8 GiB: the busy model's memory would make it fit once its request ends.
    wanted = attrs.evolve(demand("job-1", 8 * GiB, consumer="comfyui"), floor=5 * GiB)
    admission = core.submit(wanted, 1.0)
    assert admission.waiting
    core.observe(host(gpu(proc(10, 8 * GiB, "ollama")), at=20.0), 20.0)
    assert not events(core.tick(20.0), EventKind.DEGRADED), "degraded before its deadline"
    core.observe(host(gpu(proc(10, 8 * GiB, "ollama")), at=31.0), 31.0)
    effects = core.tick(31.0)
    (grant,) = [e for e in effects if isinstance(e, Grant)]
    assert grant.lease.pending == 5 * GiB
    (event,) = events(effects, EventKind.DEGRADED)
    assert event.reason == FailureClass.LEASE_TIMEOUT.value
    assert not [e for e in effects if isinstance(e, Reject | Unload)]
    core.release(grant.lease.id, 32.0)
    core.release(busy.id, 32.0)
    assert core.leases() == [] and core.waiting() == []


def test_at_its_deadline_a_floor_that_is_not_free_fails_lease_timeout_and_keeps_nothing():
    core, busy = busy_card()
    wanted = attrs.evolve(demand("job-1", 8 * GiB, consumer="comfyui"), floor=7 * GiB)
    admission = core.submit(wanted, 1.0)
    assert admission.waiting
    core.observe(host(gpu(proc(10, 8 * GiB, "ollama")), at=31.0), 31.0)
    effects = core.tick(31.0)
    (reject,) = [e for e in effects if isinstance(e, Reject)]
    assert reject.ticket_id == admission.ticket_id
    assert reject.failure.failure_class is FailureClass.LEASE_TIMEOUT
    assert "nor its floor of 7.0 GiB" in reject.failure.message, reject.failure.message
    assert not events(effects, EventKind.DEGRADED)
    assert [lease.id for lease in core.leases()] == [busy.id] and core.waiting() == []


def test_a_job_is_granted_its_floor_and_its_job_lease_holds_the_floor():
    core, _ = busy_warm_card()
    job = flux(scope=LeaseScope.JOB, floor=4 * GiB)
    admission = core.submit(job, 60.0)
    assert admission.lease is not None, admission.failure
    lease = admission.lease
    assert lease.job_of is not None
    # What is free now (4.6 GiB), above its 4 GiB floor: all it can have beside the busy.
    (event,) = events(admission.effects, EventKind.DEGRADED)
    assert event.ceiling == CEILING and 4 * GiB < event.bytes < 5 * GiB
    assert core.lease(lease.job_of).pending == event.bytes
    core.job_events.job_done("comfyui", lease.id, 70.0)
    assert [x for x in core.leases() if x.key.consumer == "comfyui"] == []


def test_a_load_that_sizes_itself_waits_for_another_lease_to_allocate():
    core = make_core(consumers=("ollama", "comfyui"))
    core.observe(host(gpu(), at=0.0), 0.0)
    other = core.submit(demand("qwen", 5 * GiB), 0.0)
    assert other.lease is not None
    fitted = attrs.evolve(demand("job-1", 4 * GiB, consumer="comfyui"), sizing=Sizing.FITS_FREE)
    admission = core.submit(fitted, 0.5)
    assert admission.waiting, "granted while ollama's 5 GiB looked free to it"
    (queued,) = events(admission.effects, EventKind.TICKET_QUEUED)
    assert queued.key == fitted.key
    # Ollama's runner allocates: the next sample shows it, and the load may start.
    effects = core.observe(host(gpu(proc(10, 5 * GiB, "ollama")), at=1.0), 1.0)
    (grant,) = [e for e in effects if isinstance(e, Grant)]
    assert grant.ticket_id == admission.ticket_id


def test_a_fixed_load_does_not_wait_for_allocations():
    core = make_core(consumers=("ollama", "comfyui"))
    core.observe(host(gpu(), at=0.0), 0.0)
    assert core.submit(demand("qwen", 5 * GiB), 0.0).lease is not None
    assert core.submit(demand("job-1", 4 * GiB, consumer="comfyui"), 0.5).lease is not None


def test_while_a_degraded_self_sizing_load_runs_its_growth_is_nobody_elses():
    core, _ = busy_warm_card()
    admission = core.submit(flux(floor=4 * GiB), 60.0)
    lease = admission.lease
    assert lease is not None and 4 * GiB < lease.pending < 5 * GiB
    # What the FLUX load may still take, up to its ceiling, is held from other grants on
    # the card while it loads (whatever the busy models free meanwhile is its).
    assert headroom(core.books, 0) == CEILING - lease.pending
    small = core.submit(demand("tiny", 512 * MiB, consumer="ollama"), 61.0)
    assert small.waiting
    core.release(lease.id, 62.0)
    assert headroom(core.books, 0) == 0
    core.cancel(small.ticket_id, 62.0)


def test_a_degraded_load_growing_up_to_its_ceiling_is_no_overrun_beyond_it_is():
    core, processes = busy_warm_card()
    admission = core.submit(flux(floor=4 * GiB), 60.0)
    assert admission.lease is not None
    others = [p for p in processes if p.owner.name != "comfyui"]
    # ComfyUI loads partially into what it sees free: 8 GiB beside its 210 MiB context.
    grown = core.observe(host(gpu(*others, proc(14, 8402 * MiB, "comfyui")), at=61.0), 61.0)
    assert not events(grown, EventKind.OVERRUN)
    assert not core.telemetry.overruns.growing(0)
    # Past its 12.5 GiB ceiling (the sample says so; the card would be full): an overrun.
    past = core.observe(host(gpu(*others, proc(14, 13_210 * MiB, "comfyui")), at=62.0), 62.0)
    (overrun,) = events(past, EventKind.OVERRUN)
    assert overrun.consumer == "comfyui" and overrun.bytes == 200 * MiB


def test_a_self_sizing_load_still_waiting_for_allocations_at_its_deadline_says_so():
    core = make_core(consumers=("ollama", "comfyui"), max_wait=30.0)
    core.observe(host(gpu(), at=0.0), 0.0)
    other = core.submit(demand("qwen", 5 * GiB), 0.0)
    assert other.lease is not None
    fitted = attrs.evolve(demand("job-1", 4 * GiB, consumer="comfyui"), sizing=Sizing.FITS_FREE)
    admission = core.submit(fitted, 0.5)
    assert admission.waiting
    # Ollama's load never shows (its runner is slow to start): nothing is granted on it.
    core.observe(host(gpu(), at=30.5), 30.5)
    (reject,) = [e for e in core.tick(30.5) if isinstance(e, Reject)]
    failure = reject.failure
    assert failure.failure_class is FailureClass.LEASE_TIMEOUT
    assert "waiting for leases not yet allocated (ollama 5.0 GiB)" in failure.message
    assert [lease.id for lease in core.leases()] == [other.lease.id] and core.waiting() == []


def test_a_degraded_demand_that_external_growth_outgrows_is_refused_saying_so():
    core, processes = whisper_warm_card()
    admission = core.submit(flux(), 60.0)
    assert admission.waiting  # evicting bge-m3 and qwen2.5:7b for the 12.1 GiB it could have
    # Plex takes 8 GiB while the unloads run: not even that can be had now.
    plex = proc(500, 8 * GiB, "plex", managed=False)
    kept = [p for p in processes if p.used not in (2012 * MiB, 5700 * MiB)]
    effects = core.observe(host(gpu(*kept, plex), at=61.0), 61.0)
    effects += core.unloaded(ResidentKey("ollama", "bge-m3"), 61.0, reclaimed=True)
    effects += core.unloaded(ResidentKey("ollama", "qwen2.5:7b"), 61.0, reclaimed=True)
    (reject,) = [e for e in effects if isinstance(e, Reject)]
    message = reject.failure.message
    assert reject.failure.failure_class is FailureClass.INSUFFICIENT_SCHEDULABLE_VRAM
    assert message.startswith("INSUFFICIENT_SCHEDULABLE_VRAM: job-3 needs 12.1 GiB"), message
    assert (
        "that is what it was degraded to: its ceiling of 12.5 GiB met "
        "INSUFFICIENT_SCHEDULABLE_VRAM" in message
    )
    assert (
        "after evicting ollama/bge-m3, ollama/qwen2.5:7b (7.5 GiB) for it: external use "
        "grew by 8.0 GiB" in message
    )
    assert core.leases() == [] and core.waiting() == []


def test_a_ceiling_not_to_be_had_before_the_deadline_is_degraded_without_waiting_for_it():
    core = make_core(consumers=("ollama", "comfyui"), max_wait=30.0)
    core.observe(host(gpu(), at=0.0), 0.0)
    # An interactive model, busy: an interactive demand may have it only 30 s after it is
    # idle, which is past its maximum wait.
    busy = core.submit(demand("big", 8 * GiB), 0.0)
    assert busy.lease is not None
    core.loaded(busy.lease.id, 0.0)
    wanted = attrs.evolve(demand("job-1", 8 * GiB, consumer="comfyui"), floor=5 * GiB)
    core.submit(wanted, 1.0)
    effects = core.observe(host(gpu(proc(10, 8 * GiB, "ollama")), at=1.5), 1.5)
    (grant,) = [e for e in effects if isinstance(e, Grant)]
    assert grant.lease.pending == 5 * GiB
    (event,) = events(effects, EventKind.DEGRADED)
    assert event.reason == FailureClass.DEADLINE_CANNOT_BE_MET.value
    assert "the memory it needs frees up only after its maximum wait" in event.detail


def test_a_ceiling_never_to_be_had_and_a_floor_only_later_is_told_to_come_back():
    core = make_core(consumers=("ollama", "comfyui"), max_wait=30.0)
    core.observe(host(gpu(), at=0.0), 0.0)
    busy = core.submit(demand("big", 8 * GiB), 0.0)
    assert busy.lease is not None
    core.loaded(busy.lease.id, 0.0)
    # 20 GiB can never be had on a 16 GiB card; its 8 GiB floor only once the busy model
    # is idle and then past its class's 30 s, after the demand's maximum wait.
    wanted = attrs.evolve(demand("job-1", 20 * GiB, consumer="comfyui"), floor=8 * GiB)
    core.submit(wanted, 1.0)
    effects = core.observe(host(gpu(proc(10, 8 * GiB, "ollama")), at=1.5), 1.5)
    (reject,) = [e for e in effects if isinstance(e, Reject)]
    failure = reject.failure
    assert failure.failure_class is FailureClass.DEADLINE_CANNOT_BE_MET, failure.message
    assert failure.bytes_needed == 8 * GiB
    # The ceiling's reason is said beside the floor's.
    assert "degraded" in failure.message and "20.0 GiB" in failure.message
    assert "INSUFFICIENT_SCHEDULABLE_VRAM" in failure.message, failure.message
    assert not events(effects, EventKind.DEGRADED)
    assert not [e for e in effects if isinstance(e, Unload)]
    core.release(busy.lease.id, 2.0)
    assert core.leases() == [] and core.waiting() == []
