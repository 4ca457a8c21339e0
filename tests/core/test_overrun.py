"""Overrun: a consumer that holds more than the gate leased it is noticed within one sample,
counted at once, grants wait while it grows, and the one resident it is pinned on has its
size learned."""

from __future__ import annotations

import attrs

from gpugate.core.classes import PriorityClass
from gpugate.core.effects import Effect, Event, EventKind, Grant, Overrun, Unload
from gpugate.core.tickets import LeaseScope, Started
from gpugate.core.units import GiB, MiB
from tests.core.builders import demand, gpu, host, make_core, proc

P = PriorityClass


def overruns(effects: list[Effect]) -> list[Event]:
    return [e for e in effects if isinstance(e, Event) and e.kind is EventKind.OVERRUN]


def of(effects: list[Effect], kind: type) -> list:
    return [e for e in effects if isinstance(e, kind)]


class Card:
    """One 16 GiB card: ollama's runners (one process each) and comfy's context."""

    def __init__(self) -> None:
        self.core = make_core(consumers=("ollama", "comfy"))
        self.now = 0.0
        self.runners: dict[str, int] = {}
        self.comfy = 0
        self.sample()

    def sample(self, **extra: int) -> list[Effect]:
        self.now += 0.5
        runners = {**self.runners, **extra}
        processes = [proc(10 + i, n, "ollama") for i, n in enumerate(runners.values())]
        if self.comfy:
            processes.append(proc(300, self.comfy, "comfy"))
        return self.core.observe(host(gpu(*processes), at=self.now), self.now)

    def resident(self, model: str, nbytes: int, priority: P = P.INTERACTIVE) -> None:
        admission = self.core.submit(demand(model, nbytes, priority=priority), self.now)
        assert admission.lease is not None
        self.core.loaded(admission.lease.id, self.now)
        self.core.release(admission.lease.id, self.now)
        self.runners[model] = nbytes
        assert overruns(self.sample()) == []


def test_a_resident_that_grows_past_its_lease_is_noticed_within_one_sample():
    card = Card()
    card.resident("qwen", 4 * GiB)
    card.runners["qwen"] = 5 * GiB
    effects = card.sample()
    (event,) = overruns(effects)
    assert (event.consumer, event.gpu, event.bytes) == ("ollama", 0, 1 * GiB)
    assert event.key is not None and event.key.model == "qwen"
    assert "ollama/qwen holds about 5.0 GiB where it was leased 4.0 GiB" in event.detail
    (overrun,) = of(effects, Overrun)
    assert overrun.key == event.key and overrun.measured == 5 * GiB
    # Counted from this sample: the budget's commitment is what NVML shows.
    assert card.core.budget(0).consumer("ollama").committed == 5 * GiB
    # Steady: nothing more to report; it grows again: reported again.
    assert overruns(card.sample()) == []
    card.runners["qwen"] = 6 * GiB
    (again,) = overruns(card.sample())
    assert again.bytes == 2 * GiB


def test_growth_below_the_tolerance_is_not_an_overrun():
    card = Card()
    card.resident("qwen", 4 * GiB)
    card.runners["qwen"] = 4 * GiB + 60 * MiB
    assert overruns(card.sample()) == []


def test_what_a_consumer_held_before_any_lease_is_its_own():
    card = Card()
    card.comfy = 210 * MiB  # ComfyUI's CUDA context, no lease explains it
    card.sample()
    job = demand("job-1", 2 * GiB, consumer="comfy")
    admission = card.core.submit(job, card.now)
    assert admission.lease is not None
    # Half loaded: NVML shows less than the books, which hides the context for a sample.
    card.comfy = 210 * MiB + 1 * GiB
    assert overruns(card.sample()) == []
    card.comfy = 210 * MiB + 2 * GiB
    assert overruns(card.sample()) == []
    card.comfy = 210 * MiB + 3 * GiB
    (event,) = overruns(card.sample())
    assert event.bytes == 1 * GiB
    assert "0.2 GiB of it its own before any lease" in event.detail


def test_a_load_larger_than_its_lease_is_pinned_on_that_load():
    card = Card()
    admission = card.core.submit(demand("llama", 3 * GiB), card.now)
    assert admission.lease is not None
    effects = card.sample(llama=int(3.8 * GiB))
    (event,) = overruns(effects)
    assert event.key == admission.lease.key
    (overrun,) = of(effects, Overrun)
    assert overrun.measured == int(3.8 * GiB)


def test_a_consumer_with_several_residents_is_not_pinned_on_one():
    card = Card()
    card.resident("qwen", 4 * GiB)
    card.resident("bge", 2 * GiB)
    card.runners["bge"] = 3 * GiB
    effects = card.sample()
    (event,) = overruns(effects)
    assert event.key is None
    assert "one of ollama/bge, ollama/qwen grew past its lease" in event.detail
    (overrun,) = of(effects, Overrun)
    assert overrun.key is None and overrun.measured is None


def test_a_demand_waits_while_an_overrun_grows_and_is_granted_once_it_stopped():
    card = Card()
    card.resident("qwen", 4 * GiB)
    card.runners["qwen"] = 6 * GiB
    card.sample()
    admission = card.core.submit(demand("small", 1 * GiB), card.now)
    assert admission.waiting, "granted on numbers an overrun may still be changing"
    (queued,) = [e for e in admission.effects if isinstance(e, Event)]
    assert queued.detail == "an overrun on GPU 0 is growing"
    asked_at_once = card.core.submit(demand("other", 1 * GiB), card.now, at_once=True)
    assert asked_at_once.deferred
    # The next sample shows it steady: the demand is planned again, and fits.
    (grant,) = of(card.sample(), Grant)
    assert grant.ticket_id == admission.ticket_id


def test_an_overrun_that_over_commits_the_card_gives_idle_memory_back_for_leases_granted_before():
    card = Card()
    card.resident("bge", 2 * GiB, priority=P.BACKGROUND)
    card.resident("qwen", 4 * GiB)
    lease = card.core.submit(demand("gemma", 8 * GiB), card.now).lease
    assert lease is not None  # granted on the numbers before the overrun: 14 of 14.6 GiB
    card.runners["qwen"] = 6 * GiB
    # While gemma's load is under way, ollama shows less than its books: nothing to judge.
    assert overruns(card.sample(gemma=1 * GiB)) == []
    effects = card.sample(gemma=8 * GiB)
    assert len(overruns(effects)) == 1
    assert [e for e in effects if isinstance(e, Event) and e.kind is EventKind.PRESSURE_ENTERED]
    assert [u.key.model for u in of(effects, Unload)] == ["bge"]


def test_a_job_its_runtime_runs_before_its_lease_is_not_an_overrun():
    card = Card()
    card.resident("qwen", 11 * GiB)  # idle, but within the equal class's grace
    sd = card.core.submit(demand("sd15", 2 * GiB, consumer="comfy"), card.now).lease
    assert sd is not None
    card.core.loaded(sd.id, card.now)
    card.core.release(sd.id, card.now)
    card.comfy = 2 * GiB
    card.sample()
    job = attrs.evolve(
        demand("job-2", 4 * GiB, consumer="comfy"),
        scope=LeaseScope.JOB,
        started=Started(unexplained=((0, 0),)),
    )
    assert card.core.submit(job, card.now).waiting
    card.comfy = 4 * GiB  # the job runs meanwhile, taking what the card has free
    assert overruns(card.sample()) == []


def test_a_process_whose_resident_follows_nvml_is_not_an_overrun_while_it_starts():
    card = Card()
    start = attrs.evolve(demand("server", 2 * GiB, consumer="comfy"), scope=LeaseScope.PROCESS)
    admission = card.core.submit(start, card.now)
    assert admission.lease is not None
    card.comfy = 1600 * MiB  # 78 %: the lease becomes the process's resident, at what shows
    assert overruns(card.sample()) == []
    card.comfy = 2 * GiB  # the rest of its model arrives
    assert overruns(card.sample()) == []
    (resident,) = card.core.residents(0)
    assert resident.process and resident.bytes == 2 * GiB
