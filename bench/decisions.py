"""The decision core's cost against the number of residents and queued tickets, in-process.

    python -m bench.decisions          # prints the curves as JSON

Each world is one GPU with `residents` busy production models of 1.5 GiB and `tickets`
interactive tickets of 30 GiB waiting for them (they fit only once residents go). The
clock moves between events as it does in the gate, so nothing cached for one `now`
survives to the next event by accident.
"""

from __future__ import annotations

import copy
import json
import statistics
import time
from collections.abc import Callable

import attrs

from gpugate.core.classes import PriorityClass, ResidencyPolicy
from gpugate.core.observation import GpuObservation, HostObservation
from gpugate.core.pressure import ReserveSettings
from gpugate.core.residents import ResidentKey
from gpugate.core.state import CoreSettings, GateCore
from gpugate.core.tickets import Demand
from gpugate.core.units import GiB

RESIDENTS = (10, 50, 100, 200)
GPUS = (1, 2, 4, 8)
HOST_RESIDENTS = 200
"""Residents on each GPU of a multi-GPU world."""
HOST_TICKETS = 1000
"""Tickets queued on the whole host, spread over its GPUs."""
TICKETS = (0, 100, 1000)
PASS_TICKETS = (100, 1000, 3000)
BATCH = 100
"""Arrivals timed against one copy of a world (the queue grows by at most this much)."""
BATCHES = 5
STEP = 0.001
"""Seconds between two events."""


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


def build(residents: int, tickets: int) -> GateCore:
    """Busy production residents; interactive tickets that must wait for them."""
    core = GateCore(
        CoreSettings(
            reserve=ReserveSettings(GiB, GiB),
            max_wait={p: 7200.0 for p in PriorityClass},
            consumer_gpus={"ollama": 0},
            queue_limit={"ollama": 10**6},
            reconcilable=frozenset({"ollama"}),
        )
    )
    total = int((residents * 1.5 + 21) * GiB)
    core.observe(
        HostObservation(0.0, 0.0, (GpuObservation(0, "GPU-0", "bench", total, 0, 0, total),)), 0.0
    )
    for n in range(residents):
        admission = core.submit(
            demand(f"resident-{n}", int(1.5 * GiB), PriorityClass.PRODUCTION), 0.0
        )
        assert admission.lease is not None
        core.loaded(admission.lease.id, 0.0)
    for n in range(tickets):
        admission = core.submit(demand(f"queued-{n}", 30 * GiB, PriorityClass.INTERACTIVE), 0.0)
        assert admission.waiting, admission
    return core


def build_host(gpus: int, residents: int, tickets: int) -> GateCore:
    """`gpus` cards, each with its consumer's `residents` busy production models; `tickets`
    interactive tickets spread over the cards, each waiting for its card's residents."""
    names = [f"ollama-{g}" for g in range(gpus)]
    core = GateCore(
        CoreSettings(
            reserve=ReserveSettings(GiB, GiB),
            max_wait={p: 7200.0 for p in PriorityClass},
            consumer_gpus={name: g for g, name in enumerate(names)},
            queue_limit={name: 10**6 for name in names},
            reconcilable=frozenset(names),
        )
    )
    total = int((residents * 1.5 + 21) * GiB)
    devices = tuple(GpuObservation(g, f"GPU-{g}", "bench", total, 0, 0, total) for g in range(gpus))
    core.observe(HostObservation(0.0, 0.0, devices), 0.0)
    for g, name in enumerate(names):
        for n in range(residents):
            wanted = on_gpu(
                demand(f"resident-{n}", int(1.5 * GiB), PriorityClass.PRODUCTION), name, g
            )
            admission = core.submit(wanted, 0.0)
            assert admission.lease is not None
            core.loaded(admission.lease.id, 0.0)
    for n in range(tickets):
        g = n % gpus
        wanted = on_gpu(demand(f"queued-{n}", 30 * GiB, PriorityClass.INTERACTIVE), names[g], g)
        assert core.submit(wanted, 0.0).waiting
    return core


def on_gpu(wanted: Demand, consumer: str, gpu: int) -> Demand:
    return attrs.evolve(wanted, key=wanted.key._replace(consumer=consumer), gpu=gpu)


def host_arrivals(gpus: int) -> list[float]:
    """Arrivals on each card in turn, planned against that card's queue."""
    world = build_host(gpus, HOST_RESIDENTS, HOST_TICKETS)
    samples: list[float] = []
    for _ in range(BATCHES):
        core = copy.deepcopy(world)
        for n in range(BATCH):
            g = n % gpus
            wanted = on_gpu(
                demand(f"new-{n}", 30 * GiB, PriorityClass.INTERACTIVE), f"ollama-{g}", g
            )
            now = 1.0 + (n + 1) * STEP
            start = time.perf_counter_ns()
            admission = core.submit(wanted, now)
            samples.append((time.perf_counter_ns() - start) / 1000)
            assert admission.waiting
    return samples


def timed(fn: Callable[[], object], repeat: int) -> list[float]:
    samples = []
    for _ in range(repeat):
        start = time.perf_counter_ns()
        fn()
        samples.append((time.perf_counter_ns() - start) / 1000)
    return samples


def p99(samples: list[float]) -> float:
    return sorted(samples)[int(0.99 * len(samples))]


def arrivals(residents: int, tickets: int) -> list[float]:
    """Arrivals that sort last, each at a later moment, planned against the queue."""
    world = build(residents, tickets)
    samples: list[float] = []
    for _ in range(BATCHES):
        core = copy.deepcopy(world)
        for n in range(BATCH):
            wanted = demand(f"new-{n}", 30 * GiB, PriorityClass.INTERACTIVE)
            now = 1.0 + (n + 1) * STEP
            start = time.perf_counter_ns()
            admission = core.submit(wanted, now)
            samples.append((time.perf_counter_ns() - start) / 1000)
            assert admission.waiting
    return samples


def queue_pass(tickets: int, residents: int = 50) -> float:
    """A full pass over the queue (all wait): median µs per ticket."""
    core = build(residents, tickets)
    clock = iter(range(1, 10**9))
    samples = timed(lambda: core.scheduler.schedule(0, 1.0 + next(clock) * STEP), 10)
    return statistics.median(samples) / tickets


def grants(residents: int) -> list[float]:
    """A model that fits and is not resident: granted at once (then its load fails)."""
    core = build(residents, 0)
    clock = iter(range(1, 10**9))
    samples: list[float] = []
    for n in range(BATCH * BATCHES):
        now = 1.0 + next(clock) * STEP
        start = time.perf_counter_ns()
        admission = core.submit(demand(f"small-{n}", GiB, PriorityClass.INTERACTIVE), now)
        samples.append((time.perf_counter_ns() - start) / 1000)
        assert admission.lease is not None
        core.release(admission.lease.id, now + STEP / 2, failed=True)
    return samples


def measure() -> dict[str, object]:
    """Every curve, in µs."""
    arrival = {}
    for residents in RESIDENTS:
        for tickets in TICKETS:
            samples = arrivals(residents, tickets)
            arrival[f"{residents}x{tickets}"] = {
                "p50": statistics.median(samples),
                "p99": p99(samples),
            }
    grant = {}
    for residents in RESIDENTS:
        samples = grants(residents)
        grant[str(residents)] = {"p50": statistics.median(samples), "p99": p99(samples)}
    per_ticket = {str(tickets): queue_pass(tickets) for tickets in PASS_TICKETS}
    host = {}
    for gpus in GPUS:
        samples = host_arrivals(gpus)
        host[str(gpus)] = {"p50": statistics.median(samples), "p99": p99(samples)}
    return {"arrival": arrival, "grant": grant, "pass_per_ticket": per_ticket, "gpus": host}


def table(result: dict[str, object]) -> list[str]:
    """The curves as markdown lines."""
    arrival: dict[str, dict[str, float]] = result["arrival"]  # type: ignore[assignment]
    grant: dict[str, dict[str, float]] = result["grant"]  # type: ignore[assignment]
    per_ticket: dict[str, float] = result["pass_per_ticket"]  # type: ignore[assignment]
    head = " | ".join(f"{t:,} queued p50 / p99" for t in TICKETS)
    lines = [
        f"An arrival that must wait, planned against the queue ({BATCH * BATCHES} arrivals, "
        f"µs; the clock moves {STEP * 1000:.0f} ms between events):",
        "",
        f"| residents | {head} |",
        "|---:|" + "---:|" * len(TICKETS),
    ]
    for residents in RESIDENTS:
        cells = " | ".join(
            f"{arrival[f'{residents}x{t}']['p50']:.0f} / {arrival[f'{residents}x{t}']['p99']:.0f}"
            for t in TICKETS
        )
        lines.append(f"| {residents} | {cells} |")
    lines += [
        "",
        "A grant of a model that fits and is not loaded, empty queue (µs):",
        "",
        "| residents | p50 | p99 |",
        "|---:|---:|---:|",
    ]
    for residents in RESIDENTS:
        row = grant[str(residents)]
        lines.append(f"| {residents} | {row['p50']:.0f} | {row['p99']:.0f} |")
    lines += [
        "",
        "A full pass over the queue, 50 residents, every ticket waits (µs per ticket):",
        "",
        "| queued | µs per ticket | pass ms |",
        "|---:|---:|---:|",
    ]
    for tickets in PASS_TICKETS:
        cost = per_ticket[str(tickets)]
        lines.append(f"| {tickets:,} | {cost:.1f} | {cost * tickets / 1000:.1f} |")
    host: dict[str, dict[str, float]] = result.get("gpus", {})  # type: ignore[assignment]
    if host:
        lines += [
            "",
            f"An arrival that must wait, on a host of N GPUs, {HOST_RESIDENTS} residents on each "
            f"and {HOST_TICKETS:,} tickets queued over them (µs; target: p99 ≤ 250 at 8 GPUs):",
            "",
            "| GPUs | p50 | p99 |",
            "|---:|---:|---:|",
        ]
        for gpus in GPUS:
            row = host[str(gpus)]
            lines.append(f"| {gpus} | {row['p50']:.0f} | {row['p99']:.0f} |")
    return lines


if __name__ == "__main__":
    result = measure()
    print(json.dumps(result, indent=1))
    print("\n".join(table(result)))
