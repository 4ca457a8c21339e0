"""No eviction for a demand that is then refused, and a reserve that moves only for
others: a hypothesis state machine over the decision core.

One 16 GiB card (1 GiB reserve, 2 GiB ceiling), six models, Plex beside them. Besides
requests, loads, releases, unloads and time, the world does what NVML does to an unload:
the runner leaves the process list before the driver has its memory back, so for a while
its bytes are used memory no process accounts for, or a process nobody claims. After every
step:

* a step that granted bytes never left committed + external + reserve above the card;
* with no external use ever on the card, the reserve is at its base;
* a demand that had residents evicted for it is refused for lack of memory
  (INSUFFICIENT_SCHEDULABLE_VRAM, DEADLINE_CANNOT_BE_MET) only if external use grew, or a
  demand of a higher class arrived, after its evictions began; and then its failure says
  what it evicted and why it cannot have the memory after all.
"""

from __future__ import annotations

import hypothesis.strategies as st
from hypothesis import HealthCheck, settings
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from gpugate.core.classes import PriorityClass, ResidencyPolicy
from gpugate.core.effects import Grant, Reject, Unload
from gpugate.core.failures import FailureClass
from gpugate.core.observation import OTHER, Owner, OwnerKind, ProcessUsage
from gpugate.core.residents import ResidentKey, ResidentState
from gpugate.core.units import GiB
from tests.core.builders import (
    RESERVED,
    TOTAL,
    assert_sums_recounted,
    demand,
    make_core,
    proc,
    world_sample,
)

P = PriorityClass
BASE = 1 * GiB
CEILING = 2 * GiB
WARM = ResidencyPolicy.ALWAYS_WARM
KEEP = ResidencyPolicy.KEEP_WARM
MODELS = (
    ("a", 1 * GiB, P.BACKGROUND, KEEP),
    ("b", 3 * GiB, P.INTERACTIVE, KEEP),
    ("c", 6 * GiB, P.PRODUCTION, KEEP),
    ("d", 8 * GiB, P.BACKGROUND, KEEP),
    ("flux", 11 * GiB, P.INTERACTIVE, KEEP),
    ("whisper", 2 * GiB, P.INTERACTIVE, WARM),
)
"""The demo's kinds: models of each class, one as large as FLUX, one that never yields
below production (whisper-server, `always_warm`)."""
FOR_LACK_OF_MEMORY = (
    FailureClass.INSUFFICIENT_SCHEDULABLE_VRAM,
    FailureClass.DEADLINE_CANNOT_BE_MET,
)


class MarginWorld(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.core = make_core(reserve=BASE, reserve_max=CEILING, max_wait=60.0, grace=5.0)
        self.now = 0.0
        self.external = 0
        self.external_ever = False
        self.materialised: dict[ResidentKey, int] = {}
        self.vanished: dict[ResidentKey, bool] = {}
        """Runners that left NVML's process list, their bytes still used: True when the
        sample reads them as a process nobody claims, False as unattributed memory."""
        self.in_flight: set[int] = set()
        self.waiting: dict[int, PriorityClass] = {}
        self.unloads: dict[ResidentKey, Unload] = {}
        self.evicted_for: dict[int, PriorityClass] = {}
        """Tickets residents were evicted for, with their class."""
        self.excused: set[int] = set()
        """Of those, the ones whose memory external growth or a higher class may take."""
        self._sample()

    # -- the world -------------------------------------------------------------------

    def _sample(self) -> None:
        processes = [
            proc(10 + i, nbytes, "ollama")
            for i, (key, nbytes) in enumerate(sorted(self.materialised.items()))
            if key not in self.vanished
        ]
        unattributed = 0
        for key, as_other in sorted(self.vanished.items()):
            nbytes = self.materialised[key]
            if as_other:
                processes.append(
                    ProcessUsage(200 + len(processes), nbytes, Owner(OwnerKind.EXTERNAL, OTHER))
                )
            else:
                unattributed += nbytes
        observation = world_sample(
            self.core, processes, self.external, self.now, unattributed=unattributed
        )
        self._apply(self.core.observe(observation, self.now))

    def _apply(self, effects) -> None:
        granted = []
        for effect in effects:
            if isinstance(effect, Grant):
                assert effect.ticket_id in self.waiting, "granted a ticket nobody waits on"
                del self.waiting[effect.ticket_id]
                self.in_flight.add(effect.lease.id)
                granted.append(effect.lease)
            elif isinstance(effect, Reject):
                assert effect.ticket_id in self.waiting, "rejected a ticket nobody waits on"
                del self.waiting[effect.ticket_id]
                self._refused(effect.ticket_id, effect.failure)
            elif isinstance(effect, Unload):
                self.unloads[effect.key] = effect
                if effect.for_ticket is not None and effect.for_ticket in self.waiting:
                    self.evicted_for[effect.for_ticket] = self.waiting[effect.for_ticket]
        if any(lease.pending > 0 for lease in granted):
            budget = self.core.budget(0)
            assert budget is not None
            total = budget.committed_total + budget.external_total + budget.reserve + RESERVED
            assert total <= TOTAL, "a grant over-committed the card"

    def _refused(self, ticket_id: int, failure) -> None:
        if ticket_id not in self.evicted_for:
            return
        assert "after evicting" in failure.message, failure.message
        if failure.failure_class in FOR_LACK_OF_MEMORY:
            assert ticket_id in self.excused, (
                f"evicted for ticket {ticket_id}, then refused with nothing external grown "
                f"and no higher class arrived: {failure.message}"
            )

    # -- rules -----------------------------------------------------------------------

    @rule(
        model=st.sampled_from(MODELS),
        klass=st.sampled_from(list(P)),
        answered=st.booleans(),
        done=st.booleans(),
    )
    def request(self, model, klass, answered, done):
        """A request for a model; `answered`: a lease granted at once is loaded at once
        (the runtime answered), `done`: and its request ends."""
        for ticket_id, theirs in self.evicted_for.items():
            if klass > theirs:
                self.excused.add(ticket_id)  # it sorts ahead and may take their memory
        name, envelope, resident_class, policy = model
        wanted = demand(
            name,
            envelope,
            priority=klass,
            resident_priority=resident_class,
            policy=policy,
            ttl=None if policy is WARM else 20.0,
        )
        admission = self.core.submit(wanted, self.now)
        if admission.waiting:
            self.waiting[admission.ticket_id] = klass
        self._apply(admission.effects)
        lease = admission.lease
        if lease is not None:
            self.in_flight.add(lease.id)
            if answered and lease.pending:
                self.materialised[lease.key] = lease.pending
                self._apply(self.core.loaded(lease.id, self.now))
            if answered and done:
                self.in_flight.discard(lease.id)
                self._apply(self.core.release(lease.id, self.now))
        elif admission.failure is not None:
            self._refused(admission.ticket_id, admission.failure)

    @precondition(lambda self: any(x.pending for x in self.core.leases()))
    @rule(data=st.data())
    def load_completes(self, data):
        lease = data.draw(st.sampled_from([x for x in self.core.leases() if x.pending]))
        self.materialised[lease.key] = lease.pending
        self._apply(self.core.loaded(lease.id, self.now))

    @precondition(lambda self: self.in_flight)
    @rule(data=st.data(), failed=st.booleans())
    def request_ends(self, data, failed):
        lease_id = data.draw(st.sampled_from(sorted(self.in_flight)))
        lease = self.core.lease(lease_id)
        if failed and lease is not None and lease.pending:
            self.materialised.pop(lease.key, None)
        self.in_flight.discard(lease_id)
        self._apply(self.core.release(lease_id, self.now, failed=failed))

    @precondition(lambda self: self.waiting)
    @rule(data=st.data())
    def client_gives_up(self, data):
        ticket_id = data.draw(st.sampled_from(sorted(self.waiting)))
        del self.waiting[ticket_id]
        self._apply(self.core.cancel(ticket_id, self.now))

    @precondition(lambda self: self.unloads)
    @rule(data=st.data(), vanishing=st.sampled_from((None, "unattributed", OTHER)))
    def unload_finishes(self, data, vanishing):
        """An unload ends. `vanishing`: first, as NVML does, a sample in which the runner
        has left the process list while the driver still has its memory (read as used
        memory no process accounts for, or as a process nobody claims)."""
        key = data.draw(st.sampled_from(sorted(self.unloads)))
        if vanishing is not None and key in self.materialised:
            self.vanished[key] = vanishing == OTHER
            self._sample()
            self.now += 0.1
        del self.unloads[key]
        self.materialised.pop(key, None)
        self.vanished.pop(key, None)
        self._sample()
        self._apply(self.core.unloaded(key, self.now, reclaimed=True))

    @rule(delta=st.sampled_from((0, 0, -1, 1, -2, 2)))
    def external_changes(self, delta):
        before = self.external
        self.external = max(0, min(6 * GiB, self.external + delta * GiB // 2))
        if self.external > before:
            self.external_ever = True
            self.excused.update(self.evicted_for)
        self._sample()

    @rule(seconds=st.floats(min_value=0.1, max_value=12.0))
    def time_passes(self, seconds):
        self.now += seconds
        self._sample()
        self._apply(self.core.tick(self.now))

    # -- invariants --------------------------------------------------------------------

    @invariant()
    def carried_sums_are_a_recount(self):
        assert_sums_recounted(self.core)

    @invariant()
    def the_reserve_moves_only_for_others(self):
        budget = self.core.budget(0)
        if budget is not None and not self.external_ever:
            assert budget.reserve == BASE, "no external use, yet the reserve grew"

    @invariant()
    def leases_and_tickets_belong_to_live_requests(self):
        assert {x.id for x in self.core.leases()} == self.in_flight
        assert {t.id for t in self.core.waiting()} == set(self.waiting)

    @invariant()
    def unloads_are_the_books_unloads(self):
        unloading = {r.key for r in self.core.residents(0) if r.state is ResidentState.UNLOADING}
        assert unloading == set(self.unloads)

    def teardown(self):
        while self.waiting:
            ticket_id = min(self.waiting)
            del self.waiting[ticket_id]
            self._apply(self.core.cancel(ticket_id, self.now))
        while self.in_flight:
            self._apply(self.core.release(self.in_flight.pop(), self.now))
        assert self.core.leases() == []


TestMarginWorld = MarginWorld.TestCase
TestMarginWorld.settings = settings(
    max_examples=200,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
