"""What the core says about the memory it finds: CPU-only loads, what caused pressure, and
an unload the runtime could not carry out."""

from __future__ import annotations

from gpugate.core.classes import PriorityClass, ResidencyPolicy
from gpugate.core.effects import Event, EventKind, Reject, Unload
from gpugate.core.failures import Failure, FailureClass
from gpugate.core.residents import ResidentState
from gpugate.core.state import ListedModel
from gpugate.core.units import GiB, MiB
from tests.core.builders import demand, gpu, host, make_core, proc

P = PriorityClass
GEMMA, QWEN, BGE = 7796 * MiB, 5700 * MiB, 2012 * MiB


def events(effects, kind: EventKind) -> list[Event]:
    return [e for e in effects if isinstance(e, Event) and e.kind is kind]


def listed(model: str, vram: int, size: int, priority=P.INTERACTIVE) -> ListedModel:
    return ListedModel(model, vram, size, priority, ResidencyPolicy.KEEP_WARM, 900.0)


def test_a_cpu_only_load_is_not_a_partial_offload():
    core = make_core()
    core.observe(host(gpu(), at=0.0), 0.0)
    effects = core.reconcile("ollama", 0, [listed("gemma3:12b", 0, GEMMA)], asked_at=1.0, now=1.0)
    assert events(effects, EventKind.PARTIAL_OFFLOAD) == []
    (cpu,) = events(effects, EventKind.CPU_ONLY)
    assert cpu.model == "gemma3:12b"
    assert cpu.detail == f"all {GEMMA} bytes on the CPU, none on the GPU"
    again = core.reconcile("ollama", 0, [listed("gemma3:12b", 0, GEMMA)], asked_at=2.0, now=2.0)
    assert events(again, EventKind.CPU_ONLY) == []


def test_pressure_from_out_of_band_residents_names_them_not_external_use():
    core = make_core()
    core.observe(host(gpu(), at=0.0), 0.0)
    models = [
        listed("gemma3:12b", GEMMA, GEMMA),
        listed("qwen2.5:7b", QWEN, QWEN),
        listed("bge-m3:latest", BGE, BGE, P.BACKGROUND),
    ]
    core.reconcile("ollama", 0, models, asked_at=1.0, now=1.0)
    sample = gpu(proc(1, GEMMA, "ollama"), proc(2, QWEN, "ollama"), proc(3, BGE, "ollama"))
    effects = core.observe(host(sample, at=2.0), 2.0)
    (entered,) = events(effects, EventKind.PRESSURE_ENTERED)
    assert entered.failure.failure_class is FailureClass.UNLEASED_GPU_USE
    assert "out-of-band residents of ollama: gemma3:12b 7.6 GiB" in entered.failure.message
    assert "no external use" not in entered.failure.message
    (started,) = events(effects, EventKind.EVICTION_STARTED)
    assert (started.model, started.reason) == ("bge-m3:latest", "pressure")
    assert "external use" not in started.detail
    assert "out-of-band residents of ollama: gemma3:12b 7.6 GiB" in started.detail


def test_a_load_larger_than_its_lease_is_not_blamed_on_external_use():
    # llama3.2:3b leased 2.13 GiB (its file) and took far more: the over-commit is the
    # gate's own estimate, with no external use on the card.
    core = make_core()
    core.observe(host(gpu(), at=0.0), 0.0)
    core.submit(demand("gemma", 9 * GiB, priority=P.BACKGROUND), 0.5)
    lease = core.submit(demand("llama3.2:3b", 2180 * MiB), 1.0).lease
    sample = gpu(proc(1, 9 * GiB, "ollama"), proc(2, 6656 * MiB, "ollama"))
    effects = core.observe(host(sample, at=2.0), 2.0)
    (entered,) = events(effects, EventKind.PRESSURE_ENTERED)
    assert entered.failure.failure_class is FailureClass.UNLEASED_GPU_USE
    assert "external" not in entered.failure.message
    assert lease is not None


def test_pressure_from_external_use_still_names_it():
    core = make_core()
    core.observe(host(gpu(), at=0.0), 0.0)
    lease = core.submit(demand("bg", 4 * GiB, priority=P.BACKGROUND), 1.0).lease
    core.loaded(lease.id, 1.0)
    core.release(lease.id, 2.0)
    sample = gpu(proc(5, 4 * GiB, "ollama"), proc(9, 11 * GiB, "plex", managed=False))
    (started,) = events(core.observe(host(sample, at=3.0), 3.0), EventKind.EVICTION_STARTED)
    assert "external 11.0 GiB: plex 11.0" in started.detail


def test_an_unload_the_runtime_could_not_do_fails_its_ticket_with_that_class():
    core = make_core()
    core.observe(host(gpu(), at=0.0), 0.0)
    bg = core.submit(demand("bg", 10 * GiB, priority=P.BACKGROUND), 1.0).lease
    core.loaded(bg.id, 1.0)
    core.release(bg.id, 1.0)
    sample = gpu(proc(5, 10 * GiB, "ollama"))
    core.observe(host(sample, at=2.0), 2.0)
    admission = core.submit(demand("big", 8 * GiB, priority=P.PRODUCTION), 2.0)
    assert admission.waiting
    crash = Failure(FailureClass.RUNTIME_CRASH, "RUNTIME_CRASH: unload: ollama did not answer")
    effects = core.unloaded(bg.key, 3.0, reclaimed=False, failure=crash)
    (reject,) = [e for e in effects if isinstance(e, Reject)]
    assert reject.failure.failure_class is FailureClass.RUNTIME_CRASH
    # The runtime's failure decided it, not memory: the budget is not the message.
    assert reject.failure.message.startswith(
        "RUNTIME_CRASH: big cannot be loaded: ollama is not answering; "
    )
    assert "schedulable" not in reject.failure.message
    assert "did not answer" in reject.failure.message
    (done,) = events(effects, EventKind.EVICTION_DONE)
    assert done.detail.startswith("unload failed: RUNTIME_CRASH; ")
    assert core.leases() == [] and core.waiting() == []


def test_memory_that_never_came_back_keeps_the_model_as_a_suspect_until_it_does():
    core = make_core()
    core.observe(host(gpu(), at=0.0), 0.0)
    bg = core.submit(demand("bg", 10 * GiB, priority=P.BACKGROUND), 1.0).lease
    core.loaded(bg.id, 1.0)
    core.release(bg.id, 1.0)
    held = gpu(proc(5, 10 * GiB, "ollama"))
    core.observe(host(held, at=2.0), 2.0)
    admission = core.submit(demand("big", 8 * GiB, priority=P.PRODUCTION), 2.0)
    assert admission.waiting
    effects = core.unloaded(bg.key, 3.0, reclaimed=False)
    (reject,) = [e for e in effects if isinstance(e, Reject)]
    assert reject.failure.failure_class is FailureClass.GPU_MEMORY_NOT_RECLAIMED
    (suspect,) = core.residents()
    assert (suspect.key, suspect.state) == (bg.key, ResidentState.SUSPECT)
    budget = core.budget(0)
    assert budget is not None and budget.consumer("ollama").resident == 10 * GiB
    # Not a victim and never timed out again: nothing is asked of the runtime in a loop.
    again = core.submit(demand("big", 8 * GiB, priority=P.PRODUCTION), 4.0)
    assert not [e for e in again.effects if isinstance(e, Unload)]
    assert not [e for e in core.tick(10_000.0) if isinstance(e, Unload)]
    # A sample with the runner's memory gone clears it.
    effects = core.observe(host(gpu(), at=10_001.0), 10_001.0)
    (gone,) = events(effects, EventKind.RESIDENT_GONE)
    assert gone.key == bg.key
    assert core.residents() == []
