"""Property tests of a process runtime's lifetime in the core, over random event sequences.

A whisper-like consumer is started under PROCESS leases, answers (`process_ready`), switches
models with a `/load` that replaces the running one (leased an envelope that may be larger
than what the new model holds), which it answers or refuses, serves requests, crashes
(`process_ended`) and is evicted, beside an Ollama consumer's loads and an external user
that grows and shrinks; NVML shows what the process holds, or nothing (a CPU build). The
same, for a consumer with a lifecycle (started, reported up, stopped, exited).
After every step:

* a grant never left committed + external + reserve above total (nor further above it than
  before: NVML may show a process's memory after the books gave it to the model replacing
  it, until the process frees it);
* every lease belongs to live work (a start, a switch or a request not yet over);
* no start or switch lease outlives its answer: a start's ends when the process answers;
  a switch's carries no bytes once answered, never waits for NVML (no deadline to show its
  memory), and a request for the new model is served at once; a switch refused leaves the
  old model resident while its process runs;
* the consumer has at most one process resident, and none once its process ended.
"""

from __future__ import annotations

import attrs
import hypothesis.strategies as st
from hypothesis import HealthCheck, settings
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from gpugate.core.classes import PriorityClass
from gpugate.core.effects import Grant, Reject, Unload
from gpugate.core.lifecycle import Eviction, LifeReport, LifeState
from gpugate.core.residents import ResidentState
from gpugate.core.tickets import LeaseScope
from gpugate.core.units import GiB
from tests.core.builders import (
    RESERVED,
    TOTAL,
    assert_sums_recounted,
    demand,
    gpu,
    host,
    make_core,
    proc,
)

P = PriorityClass
W = "whisper"
MODELS = {"turbo": 2 * GiB, "base": GiB // 4, "medium": 3 * GiB}


class ProcessWorld(RuleBasedStateMachine):
    lifecycle = False
    """The consumer has a lifecycle (the gate's process runtimes): starts, stops and exits
    are reported through it."""

    def __init__(self) -> None:
        super().__init__()
        self.core = make_core(max_wait=30.0, consumers=(W, "ollama"))
        if self.lifecycle:
            self.core.lifecycles.register(W, Eviction.STOP, 0.0)
        self.now = 0.0
        self.external = 0
        self.shows = True
        self.running: str | None = None
        """The model the simulated process holds (None: no process)."""
        self.work: dict[int, str] = {}
        """Live leases → what they are (start, load, request, ollama)."""
        self.waiting: dict[int, str] = {}
        self._sample()

    def _sample(self) -> None:
        processes = []
        if self.running is not None and self.shows:
            processes.append(proc(300, MODELS[self.running], W))
        ollama = sum(
            x.demand.envelope for x in self.core.leases() if x.key.consumer == "ollama"
        ) + sum(r.bytes for r in self.core.residents() if r.key.consumer == "ollama")
        if ollama:
            processes.append(proc(400, ollama, "ollama"))
        if self.external:
            processes.append(proc(500, self.external, "plex", managed=False))
        self._call(self.core.observe, host(gpu(*processes), at=self.now), self.now)

    def _used(self) -> int:
        budget = self.core.budget(0)
        if budget is None:  # before the first sample
            return 0
        return budget.committed_total + budget.external_total + budget.reserve + RESERVED

    def _call(self, call, *args, **kwargs) -> None:  # type: ignore[no-untyped-def]
        """Call the core and apply its effects, judged against the books before the call."""
        before = self._used()
        self._apply(call(*args, **kwargs), before)

    def _apply(self, effects, before: int) -> None:
        granted = False
        for effect in effects:
            if isinstance(effect, Grant):
                self.work[effect.lease.id] = self.waiting.pop(effect.ticket_id)
                granted = granted or effect.lease.pending > 0
            elif isinstance(effect, Reject):
                del self.waiting[effect.ticket_id]
            elif isinstance(effect, Unload):
                if effect.key.consumer == W:
                    self.running = None  # eviction is a stop
                    if self.lifecycle:
                        self._apply(
                            self.core.lifecycles.reported(W, LifeReport.STOPPED, self.now), before
                        )
                self._apply(self.core.unloaded(effect.key, self.now, reclaimed=True), before)
        if granted:
            assert self._used() <= max(TOTAL, before)

    def _submit(self, what: str, wanted) -> None:  # type: ignore[no-untyped-def]
        before = self._used()
        admission = self.core.submit(wanted, self.now)
        if admission.lease is not None:
            self.work[admission.lease.id] = what
            assert admission.lease.pending == 0 or self._used() <= max(TOTAL, before)
        elif admission.ticket_id is not None:
            self.waiting[admission.ticket_id] = what
        self._apply(admission.effects, before)

    def _pending(self, what: str) -> bool:
        """One start or switch at a time, as the gate runs them (one lock per consumer)."""
        return what in self.work.values() or what in self.waiting.values()

    def _process_resident(self):  # type: ignore[no-untyped-def]
        found = [r for r in self.core.residents() if r.key.consumer == W and r.process]
        return found[0] if found else None

    @rule(model=st.sampled_from(sorted(MODELS)))
    @precondition(lambda self: self.running is None and not self._pending("start"))
    def start(self, model):
        wanted = attrs.evolve(
            demand(model, MODELS[model], consumer=W), scope=LeaseScope.PROCESS, appear_within=20.0
        )
        self._submit("start", wanted)

    @rule()
    @precondition(lambda self: "start" in self.work.values())
    def ready(self):
        lease_id = next(i for i, what in self.work.items() if what == "start")
        lease = self.core.lease(lease_id)
        del self.work[lease_id]
        if lease is None:
            return
        self.running = lease.key.model
        if self.lifecycle:
            self._call(self.core.lifecycles.start, W, lease_id, self.now)
            assert self.core.lifecycle(W).state is LifeState.STARTING
            self._call(self.core.lifecycles.reported, W, LifeReport.UP, self.now)
        else:
            self._call(self.core.process_ready, lease_id, self.now)
        assert self.core.lease(lease_id) is None, "a start's lease ends with its answer"

    @rule(model=st.sampled_from(sorted(MODELS)), extra=st.integers(min_value=0, max_value=2))
    @precondition(lambda self: self.running is not None and not self._pending("load"))
    def load(self, model, extra):
        # Leased `extra` GiB more than the model holds (an envelope not its own).
        old = self._process_resident()
        wanted = attrs.evolve(
            demand(model, MODELS[model] + extra * GiB, consumer=W),
            scope=LeaseScope.PROCESS,
            appear_within=20.0,
            replaces=None if old is None else old.key,
            switch=True,
        )
        self._submit("load", wanted)

    @rule(ok=st.booleans())
    @precondition(
        # Only a process that runs answers (a /load granted while it starts again after a
        # crash waits for its port).
        lambda self: (
            "load" in self.work.values()
            and self.running is not None
            and "start" not in self.work.values()
        )
    )
    def load_answered(self, ok):
        lease_id = next(i for i, what in self.work.items() if what == "load")
        lease = self.core.lease(lease_id)
        del self.work[lease_id]
        if lease is None:
            return
        if not ok:
            # Refused before it freed anything: the process keeps its model.
            out = self.core.books.switched_out.get(lease_id)
            self._call(self.core.release, lease_id, self.now, failed=True)
            if out is not None and lease.key != out.key:
                back = self.core.resident(out.key)
                assert back is not None and back.state is ResidentState.RESIDENT and back.process
            return
        self.running = lease.key.model
        self._call(self.core.loaded, lease_id, self.now)
        assert lease.pending == 0, "its answer ends what it waited for"
        resident = self.core.resident(lease.key)
        assert resident is not None and resident.state is ResidentState.RESIDENT
        assert resident.process and resident.tracks_observed
        # The next request on the new model is served at once, whatever NVML shows.
        admission = self.core.submit(demand(lease.key.model, resident.bytes, consumer=W), self.now)
        assert admission.lease is not None and admission.lease.pending == 0
        self._call(self.core.release, admission.lease.id, self.now)
        self._call(self.core.release, lease_id, self.now)
        assert self.core.lease(lease_id) is None

    @rule()
    @precondition(lambda self: self._process_resident() is not None)
    def request(self):
        resident = self._process_resident()
        self._submit("request", demand(resident.key.model, resident.bytes, consumer=W))

    @rule(size=st.integers(min_value=1, max_value=6))
    def ollama_load(self, size):
        self._submit("ollama", demand(f"m{size}", size * GiB, priority=P.BACKGROUND))

    @rule(data=st.data())
    @precondition(lambda self: any(w in ("request", "ollama") for w in self.work.values()))
    def request_ends(self, data):
        ids = sorted(i for i, w in self.work.items() if w in ("request", "ollama"))
        lease_id = data.draw(st.sampled_from(ids))
        del self.work[lease_id]
        self._call(self.core.release, lease_id, self.now)

    @rule()
    @precondition(lambda self: self.running is not None)
    def crash(self):
        self.running = None
        if self.lifecycle:
            self._call(
                self.core.lifecycles.reported, W, LifeReport.EXITED, self.now, "its process ended"
            )
        else:
            self._call(self.core.process_ended, W, self.now, "its process ended")
        for lease_id, what in list(self.work.items()):
            if what in ("start", "load"):
                del self.work[lease_id]
                self._call(self.core.release, lease_id, self.now, failed=True)

    @rule(shows=st.booleans())
    def nvml_shows_it(self, shows):
        self.shows = shows
        self._sample()

    @rule(delta=st.integers(min_value=-3, max_value=3))
    def external_changes(self, delta):
        self.external = max(0, self.external + delta * GiB)
        self._sample()

    @rule(seconds=st.floats(min_value=0.1, max_value=25.0))
    def time_passes(self, seconds):
        self.now += seconds
        self._sample()
        self._call(self.core.tick, self.now)
        # A start whose process never showed lapsed: its lease is gone.
        for lease_id, what in list(self.work.items()):
            if self.core.lease(lease_id) is None and what in ("start", "load"):
                del self.work[lease_id]

    @invariant()
    def carried_sums_are_a_recount(self):
        assert_sums_recounted(self.core)

    @invariant()
    def leases_belong_to_live_work(self):
        assert {x.id for x in self.core.leases()} <= set(self.work)

    @invariant()
    def a_switch_never_waits_for_nvml(self):
        for lease in self.core.leases():
            if lease.demand.switch:
                assert lease.appear_by is None

    @invariant()
    def one_process_resident_and_none_without_a_process(self):
        residents = [
            r
            for r in self.core.residents()
            if r.key.consumer == W and r.process and r.state is ResidentState.RESIDENT
        ]
        assert len(residents) <= 1
        if self.running is None and not any(w in ("start", "load") for w in self.work.values()):
            assert residents == [] or not residents[0].shown or not self.shows

    def teardown(self):
        # Every client goes away; a cancel may grant a ticket still waiting (it ends too).
        while self.waiting:
            ticket_id = min(self.waiting)
            del self.waiting[ticket_id]
            self._call(self.core.cancel, ticket_id, self.now)
        while self.work:
            lease_id = min(self.work)
            del self.work[lease_id]
            self._call(self.core.release, lease_id, self.now)
        assert self.core.leases() == []
        assert self.core.waiting() == []


class LifecycleProcessWorld(ProcessWorld):
    """The same, for a consumer with a lifecycle, as the gate's process runtimes have."""

    lifecycle = True


SETTINGS = settings(
    max_examples=150,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestProcessWorld = ProcessWorld.TestCase
TestProcessWorld.settings = SETTINGS
TestLifecycleProcessWorld = LifecycleProcessWorld.TestCase
TestLifecycleProcessWorld.settings = SETTINGS
