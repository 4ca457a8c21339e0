"""Runtime lifecycles in the core: stopped, starting, up, asleep, stopping; Start, Wake, Stop
and Sleep effects out, reports of the lifecycle interface in. No sockets, a fake clock."""

from __future__ import annotations

import hypothesis.strategies as st
from hypothesis import HealthCheck, settings
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from gpugate.core.classes import PriorityClass
from gpugate.core.effects import Event, EventKind, Grant, Sleep, Start, Stop, Unload, Wake
from gpugate.core.lifecycle import Eviction, Lifecycles, LifeReport, LifeState
from gpugate.core.operator import EvictionRefused
from gpugate.core.residents import ResidentKey, ResidentState
from gpugate.core.tickets import LeaseScope
from gpugate.core.units import GiB
from tests.core.builders import assert_sums_recounted, demand, gpu, host, make_core, proc

W = "whisper"
KEY = ResidentKey(W, "turbo")


def start_demand(priority: PriorityClass = PriorityClass.BACKGROUND):
    import attrs

    return attrs.evolve(
        demand("turbo", 2 * GiB, consumer=W, priority=priority), scope=LeaseScope.PROCESS
    )


def core_with(eviction: Eviction):
    core = make_core(consumers=(W, "ollama"))
    core.lifecycles.register(W, eviction, 0.0)
    core.observe(host(gpu(), at=0.0), 0.0)
    return core


def started(core, now: float = 1.0):
    """A start admitted, carried out and reported up: the runtime is resident."""
    admission = core.submit(start_demand(), now)
    lease = admission.lease
    assert lease is not None
    effects = core.lifecycles.start(W, lease.id, now)
    assert [type(e) for e in effects] == [Start, Event]
    core.lifecycles.reported(W, LifeReport.UP, now + 1)
    return lease


def test_a_held_start_lease_starts_a_stopped_runtime_once():
    core = core_with(Eviction.STOP)
    lease = core.submit(start_demand(), 1.0).lease
    assert lease is not None
    effects = core.lifecycles.start(W, lease.id, 1.0)
    assert effects[0] == Start(W, 0, lease.id)
    assert isinstance(effects[1], Event) and effects[1].kind is EventKind.LIFECYCLE
    assert effects[1].detail == "stopped → starting"
    assert core.lifecycle(W).state is LifeState.STARTING
    assert core.lifecycles.start(W, lease.id, 1.5) == []  # starting already: no second start


def test_up_makes_the_start_lease_the_resident():
    core = core_with(Eviction.STOP)
    lease = started(core)
    assert core.lease(lease.id) is None
    resident = core.resident(KEY)
    assert resident is not None and resident.state is ResidentState.RESIDENT and resident.process
    assert core.lifecycle(W).state is LifeState.UP
    assert core.lifecycle(W).start_lease is None


def test_a_failed_start_releases_its_lease_and_backs_off():
    core = core_with(Eviction.STOP)
    lease = core.submit(start_demand(), 1.0).lease
    core.lifecycles.start(W, lease.id, 1.0)
    effects = core.lifecycles.reported(W, LifeReport.START_FAILED, 2.0, "exit status 1")
    assert core.lease(lease.id) is None
    assert core.resident(KEY) is None
    assert core.lifecycle(W).state is LifeState.STOPPED
    assert core.start_wait(W, 2.0) == 1.0
    kinds = [e.kind for e in effects if isinstance(e, Event)]
    assert EventKind.LIFECYCLE in kinds and EventKind.LEASE_RELEASED in kinds
    # A second failure in a row doubles the wait.
    core.observe(host(gpu(), at=3.5), 3.5)
    lease = core.submit(start_demand(), 3.5).lease
    core.lifecycles.start(W, lease.id, 3.5)
    core.lifecycles.reported(W, LifeReport.START_FAILED, 4.0)
    assert core.start_wait(W, 4.0) == 2.0


def test_an_eviction_of_a_runtime_with_a_lifecycle_is_a_stop():
    core = core_with(Eviction.STOP)
    started(core)
    effects = core.operator.evict(KEY, 10.0, force=False)
    stops = [e for e in effects if isinstance(e, Unload)]
    assert len(stops) == 1 and isinstance(stops[0], Stop) and stops[0].key == KEY
    assert core.lifecycle(W).state is LifeState.STOPPING
    core.lifecycles.reported(W, LifeReport.STOPPED, 11.0)
    core.unloaded(KEY, 11.0, reclaimed=True)
    assert core.lifecycle(W).state is LifeState.STOPPED
    assert core.resident(KEY) is None


def test_a_sleeping_runtime_is_put_to_sleep_and_woken():
    core = core_with(Eviction.SLEEP)
    started(core)
    effects = core.operator.evict(KEY, 10.0, force=False)
    assert any(isinstance(e, Sleep) for e in effects)
    core.lifecycles.reported(W, LifeReport.ASLEEP, 11.0)
    core.unloaded(KEY, 11.0, reclaimed=True)
    assert core.lifecycle(W).state is LifeState.ASLEEP
    core.observe(host(gpu(), at=12.0), 12.0)
    lease = core.submit(start_demand(), 12.0).lease
    effects = core.lifecycles.start(W, lease.id, 12.0)
    assert effects[0] == Wake(W, 0, lease.id)
    # A wake that fails leaves it asleep, not stopped.
    core.lifecycles.reported(W, LifeReport.START_FAILED, 13.0)
    assert core.lifecycle(W).state is LifeState.ASLEEP
    assert core.lease(lease.id) is None


def test_an_eviction_for_a_higher_class_is_a_stop_on_the_same_card():
    core = core_with(Eviction.STOP)
    started(core)
    core.observe(host(gpu(proc(300, 2 * GiB, W), proc(9, 12 * GiB, "plex", managed=False)),
                      at=5.0), 5.0)  # fmt: skip
    admission = core.submit(
        demand("llama", 2 * GiB, priority=PriorityClass.INTERACTIVE, consumer="ollama"), 6.0
    )
    assert admission.lease is None
    stops = [e for e in admission.effects if isinstance(e, Unload)]
    assert [type(e) for e in stops] == [Stop]
    assert stops[0].for_ticket is not None


def test_a_stop_that_failed_leaves_it_up():
    core = core_with(Eviction.STOP)
    started(core)
    core.operator.evict(KEY, 10.0, force=False)
    core.lifecycles.reported(W, LifeReport.STOP_FAILED, 10.5, "systemctl timed out")
    assert core.lifecycle(W).state is LifeState.UP


def test_an_exit_takes_the_resident_and_pending_start_leases():
    core = core_with(Eviction.STOP)
    started(core)
    effects = core.lifecycles.reported(W, LifeReport.EXITED, 20.0, "killed by SIGABRT")
    assert core.resident(KEY) is None
    assert core.lifecycle(W).state is LifeState.STOPPED
    assert any(isinstance(e, Event) and e.kind is EventKind.RESIDENT_GONE for e in effects)
    assert core.start_wait(W, 20.0) == 1.0


def test_a_consumer_without_a_lifecycle_unloads():
    core = make_core()
    core.observe(host(gpu(), at=0.0), 0.0)
    lease = core.submit(demand("llama", GiB), 1.0).lease
    core.loaded(lease.id, 1.0)
    core.release(lease.id, 2.0)
    effects = core.operator.evict(ResidentKey("ollama", "llama"), 3.0, force=False)
    unloads = [e for e in effects if isinstance(e, Unload)]
    assert [type(e) for e in unloads] == [Unload]
    assert core.lifecycles.start("ollama", lease.id, 3.0) == []
    assert core.lifecycles.reported("ollama", LifeReport.UP, 3.0) == []


def test_found_reports_set_the_state_without_a_lease():
    lives = Lifecycles()
    lives.register(W, Eviction.SLEEP, 0.0)
    outcome = lives.report(W, LifeReport.FOUND_ASLEEP, 1.0)
    assert outcome is not None and outcome.after is LifeState.ASLEEP
    assert outcome.start_lease is None
    assert lives.report(W, LifeReport.FOUND_UP, 2.0).after is LifeState.UP
    assert lives.get(W).since == 2.0


def test_a_stop_on_purpose_is_a_state_and_a_failure_lasts_until_a_start_succeeds():
    core = core_with(Eviction.STOP)
    life = core.lifecycle(W)
    assert life.stopped_on_purpose, "not started yet"
    started(core)
    core.operator.evict(KEY, 10.0, force=False)
    assert life.stopped_on_purpose and not life.failing  # stopping
    core.lifecycles.reported(W, LifeReport.STOPPED, 11.0)
    core.unloaded(KEY, 11.0, reclaimed=True)
    assert life.stopped_on_purpose
    core.observe(host(gpu(), at=12.0), 12.0)
    lease = core.submit(start_demand(), 12.0).lease
    core.lifecycles.start(W, lease.id, 12.0)
    core.lifecycles.reported(W, LifeReport.START_FAILED, 13.0)
    assert life.failing and not life.stopped_on_purpose
    core.lifecycles.reported(W, LifeReport.FOUND_STOPPED, 14.0)
    assert life.failing, "found stopped after a failure: still failing"
    core.observe(host(gpu(), at=20.0), 20.0)
    started(core, 20.0)
    assert not life.failing
    core.lifecycles.reported(W, LifeReport.EXITED, 30.0, "killed by SIGABRT")
    assert life.failing and life.state is LifeState.STOPPED


BASE = ResidentKey(W, "base")


def switch_demand(model: str = "base", envelope: int = 2 * GiB):
    """whisper-server's /load: the new model, leased `envelope`, in the old one's place."""
    import attrs

    return attrs.evolve(
        demand(model, envelope, consumer=W),
        scope=LeaseScope.PROCESS,
        appear_within=120.0,
        replaces=KEY,
        switch=True,
    )


def test_a_switch_to_a_smaller_model_ends_with_its_answer_whatever_nvml_shows():
    core = core_with(Eviction.STOP)
    started(core)
    core.observe(host(gpu(proc(300, 2 * GiB, W)), at=3.0), 3.0)
    lease = core.submit(switch_demand(), 4.0).lease
    assert lease is not None and lease.pending == 2 * GiB
    assert lease.appear_by is None, "no deadline to show its memory"
    assert core.resident(KEY) is None, "the runtime frees the old model first"
    # base holds a quarter of its lease: NVML never shows the 2 GiB.
    core.observe(host(gpu(proc(300, GiB // 4, W)), at=5.0), 5.0)
    assert core.lease(lease.id) is lease and lease.pending == 2 * GiB
    core.loaded(lease.id, 5.5)  # whisper-server answered 200
    assert lease.pending == 0
    resident = core.resident(BASE)
    assert resident is not None and resident.state is ResidentState.RESIDENT
    assert resident.process and resident.tracks_observed
    request = core.submit(demand("base", GiB // 4, consumer=W), 5.6)
    assert request.lease is not None and request.lease.pending == 0, "served at once"
    core.release(request.lease.id, 6.0)
    core.release(lease.id, 6.0)
    assert core.leases() == []
    core.observe(host(gpu(proc(300, GiB // 4, W)), at=7.0), 7.0)
    assert core.resident(BASE).bytes == GiB // 4, "the next sample corrects the books"
    late = [e for e in core.tick(600.0) if isinstance(e, Event) and e.kind is EventKind.FAILURE]
    assert late == []


def test_a_refused_switch_leaves_the_old_model_as_the_runtime_does():
    core = core_with(Eviction.STOP)
    started(core)
    # The /load's own 0-byte lease on the running model, then its switch.
    busy = core.submit(demand("turbo", 2 * GiB, consumer=W), 3.0).lease
    assert busy is not None and busy.pending == 0
    lease = core.submit(switch_demand("missing"), 3.0).lease
    assert lease is not None and core.resident(KEY) is None
    core.release(lease.id, 3.5, failed=True)  # whisper-server answered 400
    old = core.resident(KEY)
    assert old is not None and old.state is ResidentState.RESIDENT and old.process
    assert old.in_flight == 1, "busy with the /load's own lease"
    core.release(busy.id, 3.6)
    assert old.idle and core.leases() == []
    assert core.resident(ResidentKey(W, "missing")) is None


def test_a_switch_its_process_did_not_survive_leaves_no_model():
    core = core_with(Eviction.STOP)
    started(core)
    lease = core.submit(switch_demand(), 3.0).lease
    assert lease is not None
    # The new model failed to initialise: whisper-server exits without an answer.
    core.lifecycles.reported(W, LifeReport.EXITED, 4.0, "exit status 1")
    assert core.lease(lease.id) is None
    assert core.residents() == []


def test_an_end_while_switching_is_no_failure_and_no_backoff():
    # whisper-server's /load of a file that opens but is no model: it frees its model,
    # fails and exits. The request's doing: stopped, not failing, started again at once.
    core = core_with(Eviction.STOP)
    started(core)
    lease = core.submit(switch_demand(), 3.0).lease
    assert lease is not None
    core.lifecycles.reported(W, LifeReport.ENDED_SWITCHING, 4.0, "exit status 1")
    assert core.lease(lease.id) is None and core.residents() == []
    life = core.lifecycle(W)
    assert (life.state, life.failing, life.stopped_on_purpose) == (LifeState.STOPPED, False, True)
    assert core.start_wait(W, 4.0) == 0.0
    # A crash after that still counts from where the backoff was.
    lease = core.submit(start_demand(), 5.0).lease
    assert lease is not None
    core.lifecycles.start(W, lease.id, 5.0)
    core.lifecycles.reported(W, LifeReport.UP, 5.5)
    core.lifecycles.reported(W, LifeReport.EXITED, 6.0, "killed by SIGKILL")
    assert core.start_wait(W, 6.0) == 1.0


class LifecycleWorld(RuleBasedStateMachine):
    """Random starts, reports and evictions of a process runtime beside Ollama's loads."""

    eviction = Eviction.STOP

    def __init__(self) -> None:
        super().__init__()
        self.now = 0.0
        self.core = core_with(self.eviction)
        self.effects: list = []
        self.pending_start: int | None = None
        self.stopping: list = []

    def _run(self, effects) -> None:
        for effect in effects:
            self.effects.append(effect)
            if isinstance(effect, (Start, Wake)):
                self.pending_start = effect.lease
            elif isinstance(effect, Unload) and effect.key.consumer == W:
                self.stopping.append(effect)
            elif isinstance(effect, Grant) and effect.lease.scope is LeaseScope.PROCESS:
                self._run(self.core.lifecycles.start(W, effect.lease.id, self.now))

    @rule(dt=st.floats(0.1, 5.0))
    def tick(self, dt: float) -> None:
        self.now += dt
        self._run(self.core.tick(self.now))

    @rule()
    def want_it(self) -> None:
        life = self.core.lifecycle(W)
        if life.state not in (LifeState.STOPPED, LifeState.ASLEEP):
            return
        if self.core.start_wait(W, self.now) > 0:
            return
        self._run(self.core.observe(host(gpu(), at=self.now), self.now))
        admission = self.core.submit(start_demand(), self.now)
        self._run(admission.effects)
        if admission.lease is not None:
            self._run(self.core.lifecycles.start(W, admission.lease.id, self.now))

    @precondition(lambda self: self.pending_start is not None)
    @rule(ok=st.booleans())
    def start_ends(self, ok: bool) -> None:
        report = LifeReport.UP if ok else LifeReport.START_FAILED
        self.pending_start = None
        self._run(self.core.lifecycles.reported(W, report, self.now))

    @rule()
    def crash(self) -> None:
        if self.core.lifecycle(W).state is LifeState.UP:
            self._run(self.core.lifecycles.reported(W, LifeReport.EXITED, self.now, "crash"))

    @rule(force=st.booleans())
    def operator_evicts(self, force: bool) -> None:
        try:
            self._run(self.core.operator.evict(KEY, self.now, force=force))
        except EvictionRefused:
            resident = self.core.resident(KEY)
            assert (
                resident is None
                or resident.state is not ResidentState.RESIDENT
                or resident.in_flight > 0
                or not force
            )

    @precondition(lambda self: bool(self.stopping))
    @rule(ok=st.booleans())
    def stop_ends(self, ok: bool) -> None:
        unload = self.stopping.pop(0)
        asleep = isinstance(unload, Sleep)
        report = (
            (LifeReport.ASLEEP if asleep else LifeReport.STOPPED) if ok else LifeReport.STOP_FAILED
        )
        self._run(self.core.lifecycles.reported(W, report, self.now))
        self._run(self.core.unloaded(unload.key, self.now, reclaimed=ok))

    @invariant()
    def carried_sums_are_a_recount(self):
        assert_sums_recounted(self.core)

    @invariant()
    def a_start_lease_is_open_exactly_while_starting(self) -> None:
        life = self.core.lifecycle(W)
        open_starts = [
            x for x in self.core.leases() if x.key.consumer == W and x.scope is LeaseScope.PROCESS
        ]
        if life.state is LifeState.STARTING:
            assert life.start_lease is not None
            assert self.core.lease(life.start_lease) is not None
        else:
            assert life.start_lease is None
            assert open_starts == [], "a start lease outlived its start"

    @invariant()
    def a_stopped_runtime_holds_no_resident_memory(self) -> None:
        life = self.core.lifecycle(W)
        resident = self.core.resident(KEY)
        if life.state in (LifeState.STOPPED, LifeState.ASLEEP):
            assert resident is None or resident.state is ResidentState.UNLOADING

    @invariant()
    def its_evictions_are_its_lifecycles(self) -> None:
        how = Sleep if self.eviction is Eviction.SLEEP else Stop
        assert all(
            type(e) is how for e in self.effects if isinstance(e, Unload) and e.key.consumer == W
        )


class SleepingWorld(LifecycleWorld):
    """The same, for a runtime whose evictions are sleeps (vLLM)."""

    eviction = Eviction.SLEEP


SETTINGS = settings(
    max_examples=60, stateful_step_count=40, deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)  # fmt: skip
TestLifecycleWorld = LifecycleWorld.TestCase
TestLifecycleWorld.settings = SETTINGS
TestSleepingWorld = SleepingWorld.TestCase
TestSleepingWorld.settings = SETTINGS
