"""The resident-model path (`GateCore.reuse`): the books it leaves, and when it stands aside.

The property test drives two cores through the same random events: one takes every
request through `submit` and `release`, the other tries the resident path first, as the
gate does, and builds the lease events the path does not return. After every step the two
must have returned the same effects and hold the same books.
"""

from __future__ import annotations

import attrs
import hypothesis.strategies as st
from hypothesis import HealthCheck, settings
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from gpugate.core.classes import PriorityClass, ResidencyPolicy
from gpugate.core.effects import Event, EventKind, Unload
from gpugate.core.residents import ResidentKey
from gpugate.core.scheduling import granted_event
from gpugate.core.scopes import released_event
from gpugate.core.state import GateCore, ListedModel
from gpugate.core.tickets import Lease, LeaseScope
from gpugate.core.units import GiB
from tests.core.builders import demand, gpu, host, make_core, proc

P = PriorityClass
MODELS = (
    ("a", 1 * GiB, P.BACKGROUND),
    ("b", 3 * GiB, P.INTERACTIVE),
    ("c", 6 * GiB, P.PRODUCTION),
    ("d", 8 * GiB, P.BENCHMARK),
)
TTLS = (None, 0.0, 20.0)


def books_of(core: GateCore, now: float) -> object:
    """Everything the two cores must agree on."""
    books = core.books
    return (
        sorted((attrs.astuple(r, recurse=False) for r in books.residents.values()), key=str),
        sorted(attrs.astuple(x, recurse=False) for x in books.leases.values()),
        sorted(books.unloads),
        [(t.id, t.state, t.deadline, t.evicting) for t in core.waiting()],
        (books.version, books.residents_version),
        core.budget(0),
        core.next_wakeup(),
        core.operator.draining("ollama"),
        core.operator.paused(),
        core.in_pressure(0),
    )


class TwinWorlds(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.full = make_core(max_wait=30.0, queue_limit=3, grace=5.0)
        self.quick = make_core(max_wait=30.0, queue_limit=3, grace=5.0)
        self.now = 0.0
        self.external = 0
        self.materialised: dict[ResidentKey, int] = {}
        self.in_flight: dict[int, tuple[Lease, Lease]] = {}
        """Lease id → the lease in the full core, the lease in the quick one."""
        self.waiting: set[int] = set()
        self.unloads: set[ResidentKey] = set()
        self.reused = 0
        self._sample()

    def _both(self, event) -> None:  # type: ignore[no-untyped-def]
        full, quick = event(self.full), event(self.quick)
        assert list(full) == list(quick)
        self._track(full)

    def _track(self, effects) -> None:  # type: ignore[no-untyped-def]
        for effect in effects:
            if isinstance(effect, Unload):
                self.unloads.add(effect.key)
            ticket = getattr(effect, "ticket_id", None)
            if ticket is not None and ticket in self.waiting:
                self.waiting.discard(ticket)
                lease = getattr(effect, "lease", None)
                if lease is not None:
                    self.in_flight[lease.id] = (lease, self.quick.lease(lease.id))

    def _sample(self) -> None:
        loading = sum(x.pending // 2 for x in self.full.leases() if x.pending)
        processes = [proc(10 + i, b, "ollama") for i, b in enumerate(self.materialised.values())]
        if loading:
            processes.append(proc(99, loading, "ollama"))
        if self.external:
            processes.append(proc(500, self.external, "plex", managed=False))
        sample = host(gpu(*processes), at=self.now)
        self._both(lambda core: core.observe(sample, self.now))

    # -- requests --------------------------------------------------------------------

    @rule(
        model=st.sampled_from(MODELS),
        klass=st.sampled_from(list(P)),
        ttl=st.sampled_from(TTLS),
        sets_ttl=st.booleans(),
        options=st.sampled_from(("", "num_ctx=8192")),
    )
    def request(self, model, klass, ttl, sets_ttl, options):
        name, envelope, resident_class = model
        policy = ResidencyPolicy.LOAD_ON_DEMAND if ttl == 0 else ResidencyPolicy.KEEP_WARM
        wanted = attrs.evolve(
            demand(name, envelope, priority=klass, resident_priority=resident_class, ttl=ttl),
            policy=policy,
            sets_ttl=sets_ttl,
            key=ResidentKey("ollama", name, options),
        )
        full = self.full.submit(wanted, self.now)
        lease = self.quick.reuse.grant(wanted, self.now)
        if lease is not None:
            self.reused += 1
            assert full.lease == lease and full.effects == (granted_event(lease),)
            assert lease.pending == 0 and lease.waited == 0.0
        else:
            quick = self.quick.submit(wanted, self.now)
            assert quick == full
            lease = quick.lease
        self._track(full.effects)
        if full.waiting:
            self.waiting.add(full.ticket_id)
        if full.lease is not None:
            assert lease is not None
            self.in_flight[lease.id] = (full.lease, lease)

    @precondition(lambda self: self.in_flight)
    @rule(data=st.data(), failed=st.booleans())
    def request_ends(self, data, failed):
        lease_id = data.draw(st.sampled_from(sorted(self.in_flight)))
        full_lease, quick_lease = self.in_flight.pop(lease_id)
        if failed and full_lease.pending:
            self.materialised.pop(full_lease.key, None)
        full = self.full.release(lease_id, self.now, failed=failed)
        resident = self.quick.reuse.release(quick_lease, self.now)
        if resident is not None:
            reason = "failed" if failed else "done"
            assert full == [released_event(quick_lease, self.now, reason)]
            assert resident is self.quick.resident(resident.key)
        else:
            assert self.quick.release(lease_id, self.now, failed=failed) == full
        self._track(full)

    @precondition(lambda self: any(x.pending for x in self.full.leases()))
    @rule(data=st.data())
    def load_completes(self, data):
        lease = data.draw(st.sampled_from([x for x in self.full.leases() if x.pending]))
        self.materialised[lease.key] = lease.pending
        self._both(lambda core: core.loaded(lease.id, self.now))

    @precondition(lambda self: self.waiting)
    @rule(data=st.data())
    def client_gives_up(self, data):
        ticket_id = data.draw(st.sampled_from(sorted(self.waiting)))
        self.waiting.discard(ticket_id)
        self._both(lambda core: core.cancel(ticket_id, self.now))

    # -- the world and the operator --------------------------------------------------

    @precondition(lambda self: self.unloads)
    @rule(data=st.data(), reclaimed=st.booleans())
    def unload_finishes(self, data, reclaimed):
        key = data.draw(st.sampled_from(sorted(self.unloads)))
        self.unloads.discard(key)
        if reclaimed:
            self.materialised.pop(key, None)
            self._sample()
        self._both(lambda core: core.unloaded(key, self.now, reclaimed=reclaimed))

    @rule(delta=st.integers(min_value=-4, max_value=4))
    def external_changes(self, delta):
        self.external = max(0, min(6 * GiB, self.external + delta * GiB // 2))
        self._sample()

    @rule(seconds=st.floats(min_value=0.1, max_value=12.0))
    def time_passes(self, seconds):
        self.now += seconds
        self._sample()
        self._both(lambda core: core.tick(self.now))

    @rule(extra=st.booleans())
    def runtime_lists_its_models(self, extra):
        listed = [
            ListedModel(key.model, nbytes, nbytes, P.BACKGROUND, r.policy, r.idle_ttl)
            for key, nbytes in self.materialised.items()
            if (r := self.full.resident(key)) is not None
        ]
        if extra:  # loaded behind the gate's back: a resident with unknown options
            listed.append(ListedModel("a", GiB, GiB, P.BACKGROUND, ResidencyPolicy.KEEP_WARM, 20.0))
        self._both(
            lambda core: core.reconcile("ollama", 0, listed, asked_at=self.now, now=self.now)
        )

    @rule(on=st.booleans())
    def operator_drains(self, on):
        if on:
            self._both(lambda core: core.operator.drain("ollama", self.now))
        else:
            self._both(lambda core: core.operator.undrain("ollama", self.now))

    @rule(on=st.booleans())
    def operator_pauses(self, on):
        if on:
            self._both(lambda core: core.operator.pause(0, self.now))
        else:
            self._both(lambda core: core.operator.resume(0, self.now))

    # -- invariants ------------------------------------------------------------------

    @invariant()
    def the_books_agree(self):
        assert books_of(self.full, self.now) == books_of(self.quick, self.now)

    def teardown(self):
        for ticket_id in sorted(self.waiting):
            self._both(lambda core, t=ticket_id: core.cancel(t, self.now))
        for lease_id in sorted(self.in_flight):
            self._both(lambda core, x=lease_id: core.release(x, self.now))
        assert books_of(self.full, self.now) == books_of(self.quick, self.now)
        assert self.quick.leases() == []


TestTwinWorlds = TwinWorlds.TestCase
TestTwinWorlds.settings = settings(
    max_examples=150,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)


# -- examples ------------------------------------------------------------------------


def resident_core() -> tuple[GateCore, Lease]:
    """A core with `m` resident and idle (its load done and released)."""
    core = make_core()
    core.observe(host(gpu(), at=0.0), 0.0)
    admission = core.submit(demand("m", GiB), 0.0)
    assert admission.lease is not None and admission.lease.pending == GiB
    core.loaded(admission.lease.id, 0.0)
    core.release(admission.lease.id, 0.0)
    return core, admission.lease


def test_a_request_for_a_resident_model_is_lent_it_with_no_effects():
    core, _ = resident_core()
    before = core.books.version
    lease = core.reuse.grant(demand("m", GiB), 1.0)
    assert lease is not None
    assert (lease.pending, lease.waited, lease.loads, lease.granted) == (0, 0.0, False, 1.0)
    resident = core.resident(ResidentKey("ollama", "m"))
    assert resident is not None and (resident.in_flight, resident.last_used) == (1, 1.0)
    assert core.books.version == before + 1
    assert core.lease(lease.id) is lease

    assert core.reuse.release(lease, 2.0) is resident
    assert (resident.in_flight, resident.last_used) == (0, 2.0)
    assert core.leases() == [] and resident.expires_at() == 902.0
    # Ended once: a second end is the full path's (which finds nothing to do).
    assert core.reuse.release(lease, 3.0) is None
    assert core.release(lease.id, 3.0) == []


def test_what_is_not_a_plain_request_for_a_resident_model_takes_the_full_path():
    core, _ = resident_core()
    assert core.reuse.grant(demand("other", GiB), 1.0) is None
    assert core.reuse.grant(attrs.evolve(demand("m", GiB), scope=LeaseScope.JOB), 1.0) is None
    assert core.reuse.grant(attrs.evolve(demand("m", GiB), lease_ttl=30.0), 1.0) is None
    core.operator.pause(0, 1.0)
    assert core.reuse.grant(demand("m", GiB), 1.0) is None
    core.operator.resume(0, 1.0)
    core.operator.drain("ollama", 1.0)
    assert core.reuse.grant(demand("m", GiB), 1.0) is None


def test_a_grant_with_a_ticket_waiting_on_its_gpu_takes_the_full_path():
    # The waiting ticket may wait to evict `m`: each request served from `m` ahead of it is
    # an overtake the swap bound counts, and past the bound `m` serves no one new.
    core, _ = resident_core()
    holder = core.reuse.grant(demand("m", GiB), 1.0)
    assert holder is not None
    waiting = core.submit(demand("big", 14 * GiB), 1.0)
    assert waiting.waiting
    assert core.reuse.grant(demand("m", GiB), 2.0) is None
    (ticket,) = core.waiting()
    admission = core.submit(demand("m", GiB), 2.0)
    assert admission.lease is not None and ticket.overtaken == 1


def test_an_end_that_leaves_something_to_do_takes_the_full_path():
    # A request that makes the model load-on-demand, the last one: its end unloads it.
    core, _ = resident_core()
    lease = core.reuse.grant(demand("m", GiB, ttl=0.0), 1.0)
    assert lease is not None
    assert core.reuse.release(lease, 2.0) is None
    effects = core.release(lease.id, 2.0)
    assert [type(e) for e in effects][:2] == [Event, Unload]

    # A ticket waits on the GPU: the end may let it in, so the queue is planned again.
    core, _ = resident_core()
    lease = core.reuse.grant(demand("m", GiB), 1.0)
    assert lease is not None
    waiting = core.submit(demand("big", 14 * GiB), 1.0)
    assert waiting.waiting
    assert core.reuse.release(lease, 2.0) is None

    # A draining consumer: its last lease's end says it is drained.
    core, _ = resident_core()
    lease = core.reuse.grant(demand("m", GiB), 1.0)
    assert lease is not None
    core.operator.drain("ollama", 1.5)
    assert core.reuse.release(lease, 2.0) is None
    kinds = [e.kind for e in core.release(lease.id, 2.0) if isinstance(e, Event)]
    assert kinds == [EventKind.LEASE_RELEASED, EventKind.CONSUMER_DRAINED]


def test_a_resident_lease_granted_by_submit_ends_on_the_resident_path():
    core, _ = resident_core()
    admission = core.submit(demand("m", GiB), 1.0)
    assert admission.lease is not None
    assert core.reuse.release(admission.lease, 2.0) is core.resident(ResidentKey("ollama", "m"))
    # The first request's lease, whose load completed, ends there too.
    fresh = make_core()
    fresh.observe(host(gpu(), at=0.0), 0.0)
    first = fresh.submit(demand("m", GiB), 0.0).lease
    assert first is not None
    fresh.loaded(first.id, 0.5)
    assert first.loads and fresh.reuse.release(first, 1.0) is not None
