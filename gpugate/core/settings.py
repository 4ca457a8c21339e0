"""What the decision core needs from the configuration, already resolved."""

from __future__ import annotations

from collections.abc import Mapping

import attrs

from gpugate.core.classes import PriorityClass
from gpugate.core.planner import PlannerSettings
from gpugate.core.pressure import ReserveSettings


@attrs.frozen
class CoreSettings:
    """Everything the core needs from the configuration, already resolved."""

    reserve: ReserveSettings
    reserve_by_gpu: Mapping[int, ReserveSettings] = attrs.field(factory=dict)
    max_wait: Mapping[PriorityClass, float] = attrs.field(factory=dict)
    consumer_gpus: Mapping[str, int | tuple[int, ...]] = attrs.field(factory=dict)
    """The GPUs each consumer may use: it has a row in each one's budget, even at 0."""
    queue_limit: Mapping[str, int] = attrs.field(factory=dict)
    default_queue_limit: int = 32
    stale_after: float = 5.0
    planner: PlannerSettings = attrs.field(factory=PlannerSettings)
    reconcilable: frozenset[str] = frozenset()
    """Consumers whose runtime lists what it has loaded (their unknown memory gets a name)."""
    preempt: Mapping[str, frozenset[PriorityClass]] = attrs.field(factory=dict)
    """Job consumers → the classes whose demands may stop their jobs (none: never)."""

    def wait_for(self, priority: PriorityClass) -> float:
        return self.max_wait.get(priority, 120.0)
