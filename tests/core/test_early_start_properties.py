"""Property tests of jobs their runtime runs before their lease (hypothesis).

A job runtime accepts a job before its lease is asked for (`Demand.started`) and starts it
at once: the job allocates memory as it runs, which a sample shows only once one is taken.
Requests of any class arrive meanwhile, load, end and are evicted; samples come at any
time; the job's lease is granted, or fails and the job is withdrawn (`GateCore.withdrawn`),
its leftovers evicted.

The claim: no grant is made on memory the early job is taking. After every step that
granted bytes, the books stay within the card even counting what the job holds beyond the
last sample: committed + external + reserve + driver reserved + unsampled ≤ total.
"""

from __future__ import annotations

import attrs
import hypothesis.strategies as st
from hypothesis import HealthCheck, settings
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from gpugate.core.classes import PriorityClass
from gpugate.core.effects import Grant, Reject, Unload
from gpugate.core.scopes import HELD_MODEL
from gpugate.core.tickets import Demand, LeaseScope, Started
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
C = "comfy"
MODELS = {"a": 2 * GiB, "c": 5 * GiB, "d": 7 * GiB}


@attrs.define
class EarlyJob:
    demand: Demand
    size: int
    taken: int = 0
    """What the runtime holds for it now."""
    seen: int = 0
    """What the last sample showed of it."""
    ticket: int | None = None
    lease: int | None = None


class EarlyWorld(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.core = make_core(max_wait=30.0, consumers=(C, "ollama"))
        self.now = 0.0
        self.external = 0
        self.loaded: dict[str, int] = {}
        """Ollama's models in memory (a granted load takes its bytes at once)."""
        self.left = 0
        """What the job runtime keeps after a job it no longer runs."""
        self.job: EarlyJob | None = None
        self.requests: dict[int, str] = {}
        self.waiting: dict[int, str] = {}
        self.unloads: list[Unload] = []
        """Unloads asked for, not yet done: their bytes are still taken."""
        self._sample()

    # -- the world ---------------------------------------------------------------------

    def _used(self) -> int:
        job = 0 if self.job is None else self.job.taken
        return self.external + sum(self.loaded.values()) + self.left + job

    def _sample(self) -> None:
        processes = [proc(100 + i, n, "ollama") for i, n in enumerate(self.loaded.values())]
        comfy = self.left + (0 if self.job is None else self.job.taken)
        if comfy:
            processes.append(proc(300, comfy, C))
        if self.external:
            processes.append(proc(500, self.external, "plex", managed=False))
        if self.job is not None:
            self.job.seen = self.job.taken
        self._apply(self.core.observe(host(gpu(*processes), at=self.now), self.now))

    def _unsampled(self) -> int:
        job = self.job
        if job is None or job.lease is not None:
            return 0
        return max(0, job.taken - job.seen)

    def _within_card(self) -> bool:
        budget = self.core.budget(0)
        assert budget is not None
        books = budget.committed_total + budget.external_total + budget.reserve + RESERVED
        return books + self._unsampled() <= TOTAL

    def _apply(self, effects) -> None:
        for effect in effects:
            if isinstance(effect, Grant):
                self._granted(effect)
            elif isinstance(effect, Reject):
                if self.job is not None and effect.ticket_id == self.job.ticket:
                    self._withdraw()
                else:
                    self.waiting.pop(effect.ticket_id, None)
            elif isinstance(effect, Unload):
                self.unloads.append(effect)

    def _granted(self, grant: Grant) -> None:
        lease = grant.lease
        job = self.job
        if job is not None and grant.ticket_id == job.ticket:
            job.lease, job.ticket = lease.id, None
            assert self._within_card()
            return
        model = self.waiting.pop(grant.ticket_id)
        self._load(lease.id, model, lease.pending)

    def _load(self, lease_id: int, model: str, pending: int) -> None:
        self.requests[lease_id] = model
        if pending:
            self.loaded[model] = MODELS[model]
            # Judged at the grant, before what it sets off (a withdrawal samples the job).
            assert self._within_card()
            self._apply(self.core.loaded(lease_id, self.now))

    def _withdraw(self) -> None:
        """The job's lease cannot be had: the runtime drops it, keeping what it loaded."""
        job = self.job
        assert job is not None
        self.left += job.taken
        self.job = None
        self._sample()
        self._apply(self.core.job_events.withdrawn(job.demand, self.now))

    # -- rules -------------------------------------------------------------------------

    @initialize(
        idle=st.lists(
            st.tuples(st.sampled_from(sorted(MODELS)), st.sampled_from(list(P))),
            unique_by=lambda pair: pair[0],
            max_size=len(MODELS),
        )
    )
    def models_loaded_and_idle(self, idle):
        """The card starts with some of Ollama's models loaded and idle, of any class."""
        for model, klass in idle:
            self.request(model, klass)
            for lease_id in [i for i, name in self.requests.items() if name == model]:
                self.request_ends_now(lease_id)
        self._sample()

    @precondition(lambda self: self.job is None)
    @rule(
        size=st.integers(min_value=1, max_value=12),
        klass=st.sampled_from(list(P)),
        share=st.integers(min_value=0, max_value=4),
    )
    def runtime_accepts_a_job(self, size, klass, share):
        """The runtime accepted a job and starts it at once: by the time its lease is asked
        for it may hold some of its memory already, unsampled."""
        nbytes = size * GiB // 2
        before = self.core.telemetry.unexplained.get(0, {}).get(C, 0)
        wanted = attrs.evolve(
            demand("workflow", nbytes, consumer=C, priority=klass),
            scope=LeaseScope.JOB,
            started=Started(((0, before),)),
        )
        self.job = EarlyJob(wanted, nbytes)
        self._allocate(share)
        admission = self.core.submit(wanted, self.now)
        if admission.lease is not None:
            self.job.lease = admission.lease.id
        elif admission.failure is not None:
            self._withdraw()
        else:
            self.job.ticket = admission.ticket_id
        self._apply(admission.effects)

    @precondition(lambda self: self.job is not None and self.job.taken < self.job.size)
    @rule(share=st.integers(min_value=1, max_value=4))
    def the_job_allocates(self, share):
        self._allocate(share)

    def _allocate(self, share: int) -> None:
        job = self.job
        assert job is not None
        room = TOTAL - RESERVED - self._used()
        job.taken += max(0, min(job.size * share // 4, job.size - job.taken, room))

    @precondition(lambda self: self.job is not None and self.job.lease is not None)
    @rule()
    def the_job_ends(self):
        job = self.job
        assert job is not None and job.lease is not None
        self.left += job.taken
        self.job = None
        self._apply(self.core.job_events.job_done(C, job.lease, self.now))

    @precondition(lambda self: self.unloads)
    @rule(data=st.data())
    def an_unload_completes(self, data):
        unload = self.unloads.pop(data.draw(st.integers(0, len(self.unloads) - 1)))
        if unload.key.consumer == C:
            assert unload.key.model == HELD_MODEL
            self.left = 0
        else:
            self.loaded.pop(unload.key.model, None)
        self._apply(self.core.unloaded(unload.key, self.now, reclaimed=True))

    @rule()
    def a_sample(self):
        self._sample()

    @rule(model=st.sampled_from(sorted(MODELS)), klass=st.sampled_from(list(P)))
    def request(self, model, klass):
        admission = self.core.submit(demand(model, MODELS[model], priority=klass), self.now)
        if admission.lease is not None:
            self._load(admission.lease.id, model, admission.lease.pending)
        elif admission.waiting:
            self.waiting[admission.ticket_id] = model
        self._apply(admission.effects)

    @precondition(lambda self: self.job is not None and self.job.ticket is not None)
    @rule(model=st.sampled_from(sorted(MODELS)), klass=st.sampled_from(list(P)))
    def a_request_while_the_job_waits(self, model, klass):
        self.request(model, klass)

    @precondition(lambda self: self.requests)
    @rule(data=st.data())
    def request_ends(self, data):
        self.request_ends_now(data.draw(st.sampled_from(sorted(self.requests))))

    def request_ends_now(self, lease_id: int) -> None:
        del self.requests[lease_id]
        self._apply(self.core.release(lease_id, self.now))

    @rule(delta=st.integers(min_value=-2, max_value=2))
    def external_changes(self, delta):
        self.external = max(0, min(4 * GiB, self.external + delta * GiB // 2))
        self._sample()

    @rule(seconds=st.floats(min_value=0.1, max_value=12.0))
    def time_passes(self, seconds):
        self.now += seconds
        self._sample()
        self._apply(self.core.tick(self.now))

    @invariant()
    def carried_sums_are_a_recount(self):
        assert_sums_recounted(self.core)

    @invariant()
    def a_waiting_early_job_is_first_in_its_queue(self):
        waiting = self.core.waiting(0)
        if self.job is not None and self.job.ticket is not None:
            assert waiting[0].id == self.job.ticket

    @invariant()
    def nothing_marked_withdrawing_once_withdrawn(self):
        assert self.core.scheduler.withdrawing == {}


TestEarlyWorld = EarlyWorld.TestCase
TestEarlyWorld.settings = settings(
    max_examples=400,
    stateful_step_count=50,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
