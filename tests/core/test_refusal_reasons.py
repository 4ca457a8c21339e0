"""A refusal says the real reason: the bytes needed, the bytes that could ever be freed for
the demand, and who holds the rest; a demand refused after residents were evicted for it
says what was evicted and what changed since, and the gate's own unloads never undo a
plan.

The demo's card with whisper-server warm (2 GiB, `always_warm`) beside its Ollama models: a
FLUX graph that also loads clip_l and ae needs a 12.5 GiB lease, and only about 12 GiB can
ever be freed. The refusal said "lower-class holders pinned by policy", which was not the
reason: the lower-class holder was idle and evictable.
"""

from __future__ import annotations

from gpugate.core.classes import PriorityClass, ResidencyPolicy
from gpugate.core.effects import Reject, Unload
from gpugate.core.failures import FailureClass
from gpugate.core.units import GiB, MiB
from tests.core.builders import demand, gpu, host, make_core, proc

P = PriorityClass
WARM = ResidencyPolicy.ALWAYS_WARM


def whisper_warm_card(*, reserve_max: int | None = None):
    """The demo's card with whisper warm, qwen2.5:7b and bge-m3 idle (no external use)."""
    consumers = ("ollama", "whisper", "comfyui", "mvoice")
    core = make_core(consumers=consumers, reserve_max=reserve_max)
    core.observe(host(gpu(), at=0.0), 0.0)
    held = (
        demand("large-v3-turbo", 2050 * MiB, consumer="whisper", policy=WARM, ttl=None),
        demand("app", 292 * MiB, consumer="mvoice", policy=WARM, ttl=None),
        demand("qwen2.5:7b", 5700 * MiB),
        demand("bge-m3", 2012 * MiB, priority=P.BACKGROUND),
    )
    for wanted in held:
        admission = core.submit(wanted, 1.0)
        assert admission.lease is not None
        core.loaded(admission.lease.id, 1.0)
        core.release(admission.lease.id, 1.0)
    processes = [
        proc(10, 2050 * MiB, "whisper"),
        proc(13, 292 * MiB, "mvoice"),
        proc(14, 210 * MiB, "comfyui"),  # its CUDA context: no lease explains it
        proc(11, 5700 * MiB, "ollama"),
        proc(12, 2012 * MiB, "ollama"),
    ]
    core.observe(host(gpu(*processes), at=60.0), 60.0)
    return core, processes


def test_a_demand_that_can_never_fit_is_told_what_could_ever_be_freed_and_who_holds_the_rest():
    core, _ = whisper_warm_card()
    flux = demand("job-3", 12_800 * MiB, consumer="comfyui")
    admission = core.submit(flux, 60.0)
    failure = admission.failure
    assert failure is not None
    assert failure.failure_class is FailureClass.INSUFFICIENT_SCHEDULABLE_VRAM
    message = failure.message
    # 16 GiB − 434 MiB driver − 1 GiB reserve − 2,050 MiB whisper − 292 MiB mVoice −
    # 210 MiB ComfyUI's context = 12,374 MiB could ever be its.
    assert message.startswith("INSUFFICIENT_SCHEDULABLE_VRAM: job-3 needs 12.5 GiB, "), message
    assert "at most 12.1 GiB could ever be freed for it, 0.4 GiB short (7.5 GiB of it " in message
    assert "residents it may evict or outlast: ollama/qwen2.5:7b 5.6, ollama/bge-m3 2.0)" in message
    assert (
        "the rest is held by: whisper/large-v3-turbo 2.0 GiB (interactive, always_warm: "
        "yields only to production), mvoice/app 0.3 GiB (interactive, always_warm: yields "
        "only to production), comfyui beyond its leases 0.2 GiB, the reserve 1.0 GiB, "
        "no external use, the driver 0.4 GiB"
    ) in message
    assert "pinned by policy" not in message
    assert failure.bytes_needed == 12_800 * MiB
    assert core.leases() == [] and core.waiting() == []
    assert not any(isinstance(e, Unload) for e in admission.effects), "nothing evicted for it"


def test_a_demand_that_waits_names_each_holder_with_what_it_is_to_it():
    core, _ = whisper_warm_card()
    # A production demand may take whisper; the interactive qwen is evictable only after
    # the equal-class grace, which its deadline does not reach.
    late = demand("big", 14 * GiB, consumer="comfyui", priority=P.INTERACTIVE)
    admission = core.submit(late, 60.0)
    assert admission.failure is not None
    message = admission.failure.message
    assert "whisper/large-v3-turbo 2.0 GiB (interactive, always_warm" in message, message
    assert "pinned by policy" not in message


def test_a_plan_undone_by_external_growth_says_what_it_evicted_and_why():
    core, processes = whisper_warm_card()
    flux = demand("job-3", 10 * GiB, consumer="comfyui")
    admission = core.submit(flux, 60.0)
    assert admission.waiting
    victims = [e for e in admission.effects if isinstance(e, Unload)]
    assert {v.key.model for v in victims} == {"bge-m3", "qwen2.5:7b"}
    # Plex starts while the unloads run: 3 GiB the plan did not count on.
    plex = proc(500, 3 * GiB, "plex", managed=False)
    effects = []
    for victim in victims:
        processes = [p for p in processes if p.used != victim.bytes]
        effects += core.observe(host(gpu(*processes, plex), at=61.0), 61.0)
        effects += core.unloaded(victim.key, 61.0, reclaimed=True)
    (reject,) = [e for e in effects if isinstance(e, Reject)]
    failure = reject.failure
    assert failure.failure_class is FailureClass.INSUFFICIENT_SCHEDULABLE_VRAM
    assert (
        "; after evicting ollama/bge-m3, ollama/qwen2.5:7b (7.5 GiB) for it: " in (failure.message)
        or "; after evicting ollama/qwen2.5:7b, ollama/bge-m3 (7.5 GiB) for it: " in failure.message
    )
    assert "external use grew by 3.0 GiB (0.0 GiB → 3.0 GiB)" in failure.message, failure.message
    assert core.leases() == [] and core.waiting() == []


def test_a_plan_the_gates_own_unloads_cannot_undo_is_granted():
    # The same plan, the unloading runners showing as used memory no process holds for a
    # sample, as NVML shows them: the reserve may grow to 2 GiB, and does not.
    core, processes = whisper_warm_card(reserve_max=2 * GiB)
    flux = demand("job-3", 12_300 * MiB, consumer="comfyui")
    admission = core.submit(flux, 60.0)
    victims = [e for e in admission.effects if isinstance(e, Unload)]
    assert len(victims) == 2
    effects = []
    for victim in victims:
        processes = [p for p in processes if p.used != victim.bytes]
        vanished = gpu(*processes, unattributed=victim.bytes)
        effects += core.observe(host(vanished, at=61.0), 61.0)
        effects += core.observe(host(gpu(*processes), at=61.5), 61.5)
        effects += core.unloaded(victim.key, 61.5, reclaimed=True)
    assert not [e for e in effects if isinstance(e, Reject)]
    (lease,) = core.leases()
    assert lease.key == flux.key and lease.pending == 12_300 * MiB
    assert core.budget(0).reserve == 1 * GiB
