"""The decision core's cost with 50 residents and 1,000 queued tickets, in-process."""

from __future__ import annotations

import statistics
import time

from gpugate.core.classes import PriorityClass, ResidencyPolicy
from gpugate.core.observation import GpuObservation, HostObservation
from gpugate.core.pressure import ReserveSettings
from gpugate.core.residents import ResidentKey
from gpugate.core.state import CoreSettings, GateCore
from gpugate.core.tickets import Demand
from gpugate.core.units import GiB

RESIDENTS = 50
QUEUED = 1000


def demand(model: str, nbytes: int, priority: PriorityClass) -> Demand:
    return Demand(
        ResidentKey("ollama", model),
        0,
        nbytes,
        priority,
        priority,
        ResidencyPolicy.KEEP_WARM,
        900.0,
    )


def build() -> GateCore:
    """50 busy production residents; 1,000 interactive tickets that must wait for them."""
    core = GateCore(
        CoreSettings(
            reserve=ReserveSettings(GiB, GiB),
            max_wait={p: 7200.0 for p in PriorityClass},
            consumer_gpus={"ollama": 0},
            queue_limit={"ollama": 10 * QUEUED},
            reconcilable=frozenset({"ollama"}),
        )
    )
    total = 96 * GiB
    core.observe(
        HostObservation(0.0, 0.0, (GpuObservation(0, "GPU-0", "bench", total, 0, 0, total),)), 0.0
    )
    for n in range(RESIDENTS):
        admission = core.submit(
            demand(f"resident-{n}", int(1.5 * GiB), PriorityClass.PRODUCTION), 0.0
        )
        assert admission.lease is not None
        core.loaded(admission.lease.id, 0.0)
    for n in range(QUEUED):
        admission = core.submit(demand(f"queued-{n}", 30 * GiB, PriorityClass.INTERACTIVE), 0.0)
        assert admission.waiting, admission
    return core


def timed(fn, repeat: int) -> list[float]:
    samples = []
    for _ in range(repeat):
        start = time.perf_counter_ns()
        fn()
        samples.append((time.perf_counter_ns() - start) / 1000)
    return samples


def measure() -> dict[str, float]:
    """Arrivals planned against 1,000 queued tickets, and a full pass over the queue."""
    core = build()
    arrivals = iter(range(10**9))

    def arrive() -> None:
        admission = core.submit(
            demand(f"new-{next(arrivals)}", 30 * GiB, PriorityClass.INTERACTIVE), 1.0
        )
        assert admission.waiting

    # 100 arrivals in a row: the queue grows from 1,000 to 1,100 tickets.
    submit = timed(arrive, 100)
    full_pass = timed(lambda: core.scheduler.schedule(0, 1.0), 20)
    return {
        "submit_median_us": statistics.median(submit),
        "submit_p99_us": sorted(submit)[int(0.99 * len(submit))],
        "queue_pass_median_us": statistics.median(full_pass),
        "queue_pass_per_ticket_us": statistics.median(full_pass) / len(core.waiting()),
    }
