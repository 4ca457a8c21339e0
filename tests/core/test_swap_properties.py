"""Property tests of the swap-aware queue (gpugate.core.swaps) over random event sequences.

Two 8 GiB models of one class that cannot be resident together on the 16 GiB card, a small
one beside them, every class asking: requests for a loaded model go ahead of earlier ones
that wait to evict it, within the bound. After every step, besides the state machine's own
checks (no grant over-commits the card, higher classes first, leases and tickets belong to
live clients):

* no waiting ticket has been overtaken more than `swap_overtakes` times;
* a ticket past the bound (waited `swap_hold` seconds, or overtaken `swap_overtakes` times)
  is overtaken no more;
* with `swap_overtakes: 0` (first come, first served) nobody is ever overtaken.
"""

from __future__ import annotations

import hypothesis.strategies as st
from hypothesis import HealthCheck, settings
from hypothesis.stateful import rule

from gpugate.core.classes import PriorityClass
from gpugate.core.planner import PlannerSettings
from gpugate.core.units import GiB
from tests.core.builders import make_core
from tests.core.test_core_properties import CoreWorld

P = PriorityClass

SWAP_MODELS = (
    ("a", 8 * GiB, P.INTERACTIVE),
    ("b", 8 * GiB, P.INTERACTIVE),
    ("e", 2 * GiB, P.BACKGROUND),
)
BOUND = PlannerSettings(equal_class_grace=3.0, yield_after=6.0, swap_hold=8.0, swap_overtakes=2)


class SwapWorld(CoreWorld):
    bound = BOUND

    def __init__(self) -> None:
        super().__init__()
        self.core = make_core(max_wait=40.0, queue_limit=4, planner=self.bound)
        self.seen: dict[int, int] = {}
        """Per waiting ticket, its overtakes after the last step."""
        self._sample()

    @rule(
        model=st.sampled_from(SWAP_MODELS),
        klass=st.sampled_from([P.INTERACTIVE, P.INTERACTIVE, P.BACKGROUND, P.PRODUCTION]),
    )
    def request(self, model, klass):
        self._request(model, klass, ttl=30.0)

    def _check_step(self, granted) -> None:
        super()._check_step(granted)
        if not hasattr(self, "seen"):
            return
        bound = self.bound
        for ticket in self.core.waiting(0):
            before = self.seen.get(ticket.id, 0)
            assert ticket.overtaken <= bound.swap_overtakes, (ticket.id, ticket.overtaken)
            if ticket.overtaken > before:
                # Overtaken in this step: it was inside the bound when it happened.
                assert before < bound.swap_overtakes
                assert self.now - ticket.arrived < bound.swap_hold, (
                    f"{ticket.demand.key} overtaken after waiting {self.now - ticket.arrived}s"
                )
            self.seen[ticket.id] = ticket.overtaken


class FifoWorld(SwapWorld):
    bound = PlannerSettings(equal_class_grace=3.0, swap_overtakes=0)


TestSwapWorld = SwapWorld.TestCase
TestSwapWorld.settings = settings(
    max_examples=300,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestFifoWorld = FifoWorld.TestCase
TestFifoWorld.settings = settings(
    max_examples=60,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
