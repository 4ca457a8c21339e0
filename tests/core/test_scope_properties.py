"""Property tests of job leases over random event sequences (hypothesis).

A consumer queues jobs of random sizes next to an Ollama consumer's requests and an
external user that grows and shrinks; jobs end in any order, waiting ones are given up.
After every step:

* the consumer's job lease holds exactly the bytes of its largest live job, and there is
  no job lease without a live job (none outlives its last job's end);
* a step that granted or grew bytes never left committed + external + reserve above total.
"""

from __future__ import annotations

import attrs
import hypothesis.strategies as st
from hypothesis import HealthCheck, settings
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from gpugate.core.classes import PriorityClass
from gpugate.core.effects import Grant, Reject, Unload
from gpugate.core.job_leases import JOBS_MODEL
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
C = "comfy"


class JobWorld(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.core = make_core(max_wait=30.0, queue_limit=4, consumers=(C, "ollama"))
        self.now = 0.0
        self.external = 0
        self.jobs: dict[int, int] = {}
        self.requests: set[int] = set()
        self.waiting: dict[int, int | None] = {}
        self._sample()

    def _sample(self) -> None:
        processes = []
        if self.external:
            processes.append(proc(500, self.external, "plex", managed=False))
        self._apply(self.core.observe(host(gpu(*processes), at=self.now), self.now))

    def _committed_ok(self) -> bool:
        budget = self.core.budget(0)
        used = budget.committed_total + budget.external_total + budget.reserve + RESERVED
        return used <= TOTAL

    def _apply(self, effects, *, held_before: int | None = None) -> None:
        before = self._held() if held_before is None else held_before
        granted = False
        for effect in effects:
            if isinstance(effect, Grant):
                size = self.waiting.pop(effect.ticket_id)
                if size is None:
                    self.requests.add(effect.lease.id)
                else:
                    self.jobs[effect.lease.id] = size
                granted = granted or effect.lease.pending > 0
            elif isinstance(effect, Reject):
                del self.waiting[effect.ticket_id]
            elif isinstance(effect, Unload):
                self._apply(self.core.unloaded(effect.key, self.now, reclaimed=True))
        if granted or self._held() > before:
            assert self._committed_ok()

    def _held(self) -> int:
        return sum(x.pending for x in self.core.leases() if x.key.model == JOBS_MODEL)

    @rule(size=st.integers(min_value=1, max_value=12), klass=st.sampled_from(list(P)))
    def job_queued(self, size, klass):
        nbytes = size * GiB // 2
        before = self._held()
        wanted = attrs.evolve(
            demand("workflow", nbytes, consumer=C, priority=klass), scope=LeaseScope.JOB
        )
        admission = self.core.submit(wanted, self.now)
        if admission.waiting:
            self.waiting[admission.ticket_id] = nbytes
        elif admission.lease is not None:
            self.jobs[admission.lease.id] = nbytes
        self._apply(admission.effects, held_before=before)
        if self._held() > before:
            assert self._committed_ok()

    @rule(size=st.integers(min_value=1, max_value=8))
    def request(self, size):
        admission = self.core.submit(
            demand(f"m{size}", size * GiB, priority=P.BACKGROUND), self.now
        )
        if admission.waiting:
            self.waiting[admission.ticket_id] = None
        elif admission.lease is not None:
            self.requests.add(admission.lease.id)
        self._apply(admission.effects)

    @precondition(lambda self: self.requests)
    @rule(data=st.data())
    def request_ends(self, data):
        lease_id = data.draw(st.sampled_from(sorted(self.requests)))
        self.requests.discard(lease_id)
        self._apply(self.core.release(lease_id, self.now))

    @precondition(lambda self: self.jobs)
    @rule(data=st.data(), failed=st.booleans())
    def job_ends(self, data, failed):
        lease_id = data.draw(st.sampled_from(sorted(self.jobs)))
        del self.jobs[lease_id]
        self._apply(self.core.job_events.job_done(C, lease_id, self.now, failed=failed))

    @precondition(lambda self: self.waiting)
    @rule(data=st.data())
    def client_gives_up(self, data):
        ticket_id = data.draw(st.sampled_from(sorted(self.waiting)))
        del self.waiting[ticket_id]
        self._apply(self.core.cancel(ticket_id, self.now))

    @rule(delta=st.integers(min_value=-4, max_value=4))
    def external_changes(self, delta):
        self.external = max(0, min(6 * GiB, self.external + delta * GiB // 2))
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
    def job_lease_is_the_largest_live_job(self):
        carriers = [x for x in self.core.leases() if x.key.model == JOBS_MODEL]
        if not self.jobs:
            assert carriers == []
        else:
            assert [x.pending for x in carriers] == [max(self.jobs.values())]

    @invariant()
    def leases_belong_to_live_work(self):
        ids = {x.id for x in self.core.leases() if x.key.model != JOBS_MODEL}
        assert ids == set(self.jobs) | self.requests

    def teardown(self):
        # Every client goes away; a grant that reaches one already gone ends at once.
        while self.waiting:
            ticket_id = min(self.waiting)
            del self.waiting[ticket_id]
            self._apply(self.core.cancel(ticket_id, self.now))
        while self.jobs:
            lease_id = min(self.jobs)
            del self.jobs[lease_id]
            self._apply(self.core.job_events.job_done(C, lease_id, self.now))
        while self.requests:
            lease_id = min(self.requests)
            self.requests.discard(lease_id)
            self._apply(self.core.release(lease_id, self.now))
        assert self.core.leases() == []
        assert self.core.waiting() == []


TestJobWorld = JobWorld.TestCase
TestJobWorld.settings = settings(
    max_examples=120,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
