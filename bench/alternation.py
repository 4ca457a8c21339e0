"""Swaps under alternation: first come, first served against the gate's swap-aware queue.

    python -m bench.alternation [--write]

The decision core itself (`GateCore`, as the gate runs it) on a virtual clock, with the
runtime's side played by a small event loop: a load takes `LOAD` seconds, an unload
`UNLOAD`, a generation `GENERATE`; NVML is sampled every `SAMPLE` seconds and the core
ticked with it, as the gate's sampler does. Nothing sleeps: a run of 1,000 requests takes
well under a second, and the same seed gives the same figures.

Two workloads on one 16 GiB card, where models A and B (9 GiB each) cannot be resident
together:

* **alternating**: 8 clients, each asking A, B, A, B... in turn (half of them start with B),
  the next request `THINK` seconds after the answer, 125 requests each;
* **seeded trace**: 8 clients, each asking for A, B or a 2 GiB C at random (seed 20260729,
  the seed of the 2,000-operation trace), one request in four background, 125 requests
  each.

Each is run with the queue's bound set to 0 (`swap_overtakes: 0`: first come, first
served) and with the configuration's defaults (`gpugate.config.model.QueueSettings`).
Counted: swaps (`gpugate_swaps_total`'s events) per 1,000 requests, the wait from a
request's arrival to its lease (p50, p99, of those granted) and requests refused.
"""

from __future__ import annotations

import argparse
import heapq
import itertools
import json
import random
import statistics
import time
from collections.abc import Callable

import attrs

from gpugate.config.model import QueueSettings
from gpugate.core.classes import PriorityClass, ResidencyPolicy
from gpugate.core.effects import Event, EventKind, Grant, Reject, Unload
from gpugate.core.observation import (
    GpuObservation,
    HostObservation,
    Owner,
    OwnerKind,
    ProcessUsage,
)
from gpugate.core.planner import PlannerSettings
from gpugate.core.pressure import ReserveSettings
from gpugate.core.residents import ResidentKey
from gpugate.core.state import CoreSettings, GateCore
from gpugate.core.tickets import Demand
from gpugate.core.units import GiB, MiB

TOTAL = 16 * GiB
RESERVED = 434 * MiB
MODELS = {"A": 9 * GiB, "B": 9 * GiB, "C": 2 * GiB}
LOAD = 3.0
"""Seconds a 9 GiB load takes (Ollama reading a model of that size from a fast disk)."""
UNLOAD = 0.5
GENERATE = 2.0
THINK = 0.5
SAMPLE = 0.5
CLIENTS = 8
REQUESTS = 1000
SEED = 20260729
MAX_WAIT = {PriorityClass.INTERACTIVE: 120.0, PriorityClass.BACKGROUND: 1800.0}


@attrs.frozen
class Figures:
    """One workload under one queue."""

    requests: int
    granted: int
    refused: int
    swaps: int
    loads: int
    p50: float
    p99: float
    seconds: float
    """Virtual seconds from the first request to the last answer."""

    @property
    def per_thousand(self) -> float:
        return self.swaps * 1000 / self.requests


def settings(fifo: bool) -> PlannerSettings:
    """The configuration's defaults; `fifo`: with the queue's bound set to 0."""
    queue = QueueSettings()
    return PlannerSettings(
        equal_class_grace=queue.equal_class_grace,
        yield_after=queue.yield_after,
        swap_hold=queue.swap_hold,
        swap_overtakes=0 if fifo else queue.swap_overtakes,
        swap_window=queue.swap_window,
    )


class Host:
    """The core, the runtime's timings and the clients' requests on a virtual clock."""

    def __init__(self, planner: PlannerSettings) -> None:
        self.core = GateCore(
            CoreSettings(
                reserve=ReserveSettings(GiB, GiB),
                max_wait=MAX_WAIT,
                consumer_gpus={"ollama": 0},
                queue_limit={"ollama": 10**6},
                planner=planner,
                reconcilable=frozenset({"ollama"}),
            )
        )
        self.now = 0.0
        self.queue: list[tuple[float, int, Callable[[], None]]] = []
        self.order = itertools.count()
        self.loaded: dict[str, int] = {}
        self.asked: dict[int, tuple[float, Callable[[], None]]] = {}
        """Waiting ticket → (arrival, what its client does once answered)."""
        self.waits: list[float] = []
        self.refused = 0
        self.swaps = 0
        self.loads = 0
        self.last = 0.0
        self.sample()

    def at(self, when: float, action: Callable[[], None]) -> None:
        heapq.heappush(self.queue, (when, next(self.order), action))

    def run(self, until_idle: Callable[[], bool]) -> None:
        self.at(SAMPLE, self.tick)
        while self.queue:
            when, _, action = heapq.heappop(self.queue)
            self.now = when
            action()
            if until_idle():
                break

    def sample(self) -> None:
        processes = tuple(
            ProcessUsage(100 + n, nbytes, Owner(OwnerKind.CONSUMER, "ollama"))
            for n, nbytes in enumerate(self.loaded.values())
        )
        used = sum(MODELS[m] for m in self.loaded)
        card = GpuObservation(
            0, "GPU-0", "bench", TOTAL, RESERVED, used, TOTAL - RESERVED - used, processes
        )
        self.apply(self.core.observe(HostObservation(self.now, self.now, (card,)), self.now))

    def tick(self) -> None:
        self.sample()
        self.apply(self.core.tick(self.now))
        self.at(self.now + SAMPLE, self.tick)

    def ask(self, model: str, klass: PriorityClass, then: Callable[[], None]) -> None:
        """A client's request: answered at once, or once its ticket is granted."""
        demand = Demand(
            ResidentKey("ollama", model),
            0,
            MODELS[model],
            klass,
            PriorityClass.INTERACTIVE,
            ResidencyPolicy.KEEP_WARM,
            900.0,
            reload_seconds=LOAD,
        )
        # As the gate takes it (gate/admission.py): the resident path first.
        lease = self.core.reuse.grant(demand, self.now)
        if lease is not None:
            self.waits.append(0.0)
            self.serve(lease, then)
            return
        admission = self.core.submit(demand, self.now)
        if admission.lease is not None:
            self.waits.append(0.0)
            self.serve(admission.lease, then)
        elif admission.failure is not None:
            self.refused += 1
            self.at(self.now, then)
        else:
            self.asked[admission.ticket_id] = (self.now, then)
        self.apply(admission.effects)

    def serve(self, lease, then: Callable[[], None]) -> None:
        """The runtime answers a leased request: loading first when the lease loads."""
        model = lease.key.model

        def done() -> None:
            if self.core.reuse.release(lease, self.now) is None:
                self.apply(self.core.release(lease.id, self.now))
            self.last = self.now
            self.at(self.now + THINK, then)

        def loaded() -> None:
            self.loaded[model] = MODELS[model]
            self.sample()
            self.apply(self.core.loaded(lease.id, self.now))
            self.at(self.now + GENERATE, done)

        if lease.pending:
            self.loads += 1
            self.at(self.now + LOAD, loaded)
        else:
            self.at(self.now + GENERATE, done)

    def unload(self, key: ResidentKey) -> None:
        def gone() -> None:
            self.loaded.pop(key.model, None)
            self.sample()
            self.apply(self.core.unloaded(key, self.now, reclaimed=True))

        self.at(self.now + UNLOAD, gone)

    def apply(self, effects) -> None:
        for effect in effects:
            if isinstance(effect, Grant):
                arrived, then = self.asked.pop(effect.ticket_id)
                self.waits.append(self.now - arrived)
                self.serve(effect.lease, then)
            elif isinstance(effect, Reject):
                _, then = self.asked.pop(effect.ticket_id)
                self.refused += 1
                self.at(self.now, then)
            elif isinstance(effect, Unload):
                self.unload(effect.key)
            elif isinstance(effect, Event) and effect.kind is EventKind.SWAP:
                self.swaps += 1

    def figures(self, requests: int) -> Figures:
        waits = sorted(self.waits)
        p99 = waits[min(len(waits) - 1, int(len(waits) * 0.99))] if waits else 0.0
        return Figures(
            requests,
            len(waits),
            self.refused,
            self.swaps,
            self.loads,
            statistics.median(waits) if waits else 0.0,
            p99,
            self.last,
        )


def alternating(planner: PlannerSettings) -> Figures:
    """8 clients, each asking A, B, A, B... (half start with B), 125 requests each."""
    host = Host(planner)
    each = REQUESTS // CLIENTS
    finished = [0]

    def client(n: int, asked: int) -> Callable[[], None]:
        def step() -> None:
            if asked == each:
                finished[0] += 1
                return
            model = "AB"[(n + asked) % 2]
            host.ask(model, PriorityClass.INTERACTIVE, client(n, asked + 1))

        return step

    for n in range(CLIENTS):
        host.at(n * 0.1, client(n, 0))
    host.run(lambda: finished[0] == CLIENTS)
    return host.figures(each * CLIENTS)


def seeded(planner: PlannerSettings, seed: int = SEED) -> Figures:
    """8 clients, each asking for A, B or C at random (seeded), a quarter of the requests
    background, 125 requests each."""
    host = Host(planner)
    rng = random.Random(seed)
    each = REQUESTS // CLIENTS
    finished = [0]

    def client(asked: int) -> Callable[[], None]:
        def step() -> None:
            if asked == each:
                finished[0] += 1
                return
            model = rng.choices("ABC", weights=(45, 45, 10))[0]
            klass = PriorityClass.BACKGROUND if rng.random() < 0.25 else PriorityClass.INTERACTIVE
            host.ask(model, klass, client(asked + 1))

        return step

    for n in range(CLIENTS):
        host.at(n * 0.1 + rng.random(), client(0))
    host.run(lambda: finished[0] == CLIENTS)
    return host.figures(each * CLIENTS)


WORKLOADS = {"alternating A B, 8 clients": alternating, "seeded trace": seeded}


def measure() -> dict[str, dict[str, Figures]]:
    """Every workload under first come, first served and under the gate's queue."""
    return {
        name: {"fifo": run(settings(fifo=True)), "gate": run(settings(fifo=False))}
        for name, run in WORKLOADS.items()
    }


def table(results: dict[str, dict[str, Figures]]) -> str:
    """The markdown written into docs/benchmarks.md."""
    queue = QueueSettings()
    rows = [
        f"Measured {time.strftime('%Y-%m-%d')}. Two 9 GiB models that cannot be resident "
        f"together on a 16 GiB card; a load takes {LOAD:g} s, an unload {UNLOAD:g} s, "
        f"a generation {GENERATE:g} s. The gate's queue: "
        f"`swap_hold` {queue.swap_hold:g} s, `swap_overtakes` {queue.swap_overtakes}, "
        f"`equal_class_grace` {queue.equal_class_grace:g} s (FIFO: the same with "
        "`swap_overtakes: 0`).",
        "",
        "| workload | queue | swaps / 1,000 requests | loads | p50 wait s | p99 wait s "
        "| refused | s to serve all |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for name, runs in results.items():
        for label, figures in (("FIFO", runs["fifo"]), ("gate", runs["gate"])):
            rows.append(
                f"| {name} | {label} | {figures.per_thousand:.0f} | {figures.loads} | "
                f"{figures.p50:.1f} | {figures.p99:.1f} | {figures.refused} | "
                f"{figures.seconds:.0f} |"
            )
    return "\n".join(rows)


def met(results: dict[str, dict[str, Figures]]) -> bool:
    """The issue's figure: at most half FIFO's swaps, at no worse p99 wait, in each workload."""
    return all(
        runs["gate"].swaps * 2 <= runs["fifo"].swaps and runs["gate"].p99 <= runs["fifo"].p99
        for runs in results.values()
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help="write docs/benchmarks.md")
    args = parser.parse_args()
    results = measure()
    print(table(results))
    print(json.dumps({n: {q: attrs.asdict(f) for q, f in r.items()} for n, r in results.items()}))
    if args.write:
        from bench.docfile import write_section

        write_section("alternation", table(results))


if __name__ == "__main__":
    main()
