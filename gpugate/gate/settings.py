"""What the decision core is configured with: the configuration resolved for it when the
gate starts, and what a reload may change in it."""

from __future__ import annotations

from gpugate.config.model import Config
from gpugate.core.planner import PlannerSettings
from gpugate.core.pressure import ReserveSettings
from gpugate.core.state import CoreSettings, GateCore


def core_settings(config: Config, reconcilable: frozenset[str] = frozenset()) -> CoreSettings:
    """Resolve the configuration into what the decision core needs (`reconcilable`: the
    consumers whose runtime lists what it holds)."""
    budget = config.budget
    settle = budget.reclaim_timeout
    reserve = ReserveSettings(
        budget.reserve, max(budget.reserve, budget.reserve_max), settle=settle
    )
    by_gpu = {
        g.index: ReserveSettings(g.reserve, max(g.reserve, budget.reserve_max), settle=settle)
        for g in config.gpus
        if g.reserve is not None
    }
    return CoreSettings(
        reserve=reserve,
        reserve_by_gpu=by_gpu,
        max_wait={c.priority: c.max_wait for c in config.classes},
        consumer_gpus={c.name: c.cards for c in config.consumers},
        queue_limit={c.name: c.queue_limit for c in config.consumers},
        stale_after=budget.stale_after,
        planner=planner_settings(config),
        reconcilable=reconcilable,
        preempt={c.name: frozenset(c.preempt) for c in config.consumers if c.preempt},
    )


def planner_settings(config: Config) -> PlannerSettings:
    """The configuration's `queue` section as the planner and the queue read it."""
    queue = config.queue
    return PlannerSettings(
        equal_class_grace=queue.equal_class_grace,
        yield_after=queue.yield_after,
        swap_hold=queue.swap_hold,
        swap_overtakes=queue.swap_overtakes,
        swap_window=queue.swap_window,
    )


def resettle(core: GateCore, settings: CoreSettings) -> None:
    """Give a running core a reloaded configuration's settings. The core's parts took their
    settings when they were built: these are the ones a reload may change."""
    core.settings = settings
    telemetry = core.telemetry
    telemetry._reserve = settings.reserve
    telemetry._reserve_by_gpu = dict(settings.reserve_by_gpu)
    for gpu, history in telemetry._history.items():
        history.settings = telemetry.reserve_settings(gpu)
    core.scheduler._max_wait = lambda demand: settings.wait_for(demand.priority)
    core.scheduler.planner = settings.planner
    core.scheduler._queue_limit = lambda name: settings.queue_limit.get(
        name, settings.default_queue_limit
    )
