"""Prometheus metrics: the budget rows as gauges on scrape, events as counters.

Gauges are computed from the gate's books when scraped (never by calling NVML on the
event loop). Leases granted and their waits come from the gate's `LeaseTally`, plain
counts kept as leases are granted and read when scraped (two requests a second or ten
thousand cost a scrape the same); the other counters are fed by events as they happen.
Every label takes its values from a closed set (`label_sets`): configured GPUs, consumers,
identities and external services, and the values of the enums below or in the core.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, disable_created_metrics
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    InfoMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from gpugate.control.health import health_document
from gpugate.control.marks import paused_seconds
from gpugate.control.queue import queue
from gpugate.core.classes import PriorityClass
from gpugate.core.effects import Event, EventKind, UnloadReason
from gpugate.core.explicit import identity_owner
from gpugate.core.failures import FailureClass
from gpugate.core.lifecycle import LifeState
from gpugate.core.observation import OTHER, UNATTRIBUTED
from gpugate.core.residents import ResidentState
from gpugate.core.waits import WaitReason
from gpugate.gate.events import WAIT_BUCKETS, label_of
from gpugate.store.db import RecordKind

if TYPE_CHECKING:
    from gpugate.config.model import Config
    from gpugate.gate.gate import Gate

GATE_WIDE = ""

REWARM_ENDS = frozenset(
    {EventKind.REWARM_DONE, EventKind.REWARM_CANCELLED, EventKind.REWARM_FAILED}
)
"""The events that end a rewarm, each counted once in `gpugate_rewarms_total` by its
`reason` (done, cancelled, failed)."""
"""The `consumer` label of what belongs to no consumer (a failing NVML driver)."""


class UnloadOutcome(enum.Enum):
    """How an unload ended, as `gpugate_unloads_finished_total` counts it."""

    RECLAIMED = "reclaimed"
    NOT_RECLAIMED = "not_reclaimed"
    """The runtime unloaded, NVML did not show the bytes back (GPU_MEMORY_NOT_RECLAIMED)."""
    FAILED = "failed"
    """The runtime could not be asked (refused, timed out, answered nonsense)."""

    @classmethod
    def of(cls, event: Event) -> UnloadOutcome:
        # The core words its EVICTION_DONE detail from these three cases, in this order.
        detail = event.detail
        if detail.startswith("unload failed"):
            return cls.FAILED
        if detail.startswith("not reclaimed"):
            return cls.NOT_RECLAIMED
        return cls.RECLAIMED


def label_sets(config: Config, gpus: Iterable[int]) -> dict[str, frozenset[str]]:
    """Every label the gate's metrics carry, with the closed set its values come from:
    `gpus` are the indices the gate samples (`uuid` and `name` are those cards' own)."""
    consumers = frozenset(c.name for c in config.consumers)
    identities = frozenset(identity_owner(i.name) for i in config.identities)
    return {
        "gpu": frozenset(str(g) for g in gpus),
        "consumer": consumers | identities | {GATE_WIDE},
        "service": frozenset(e.name for e in config.external) | {OTHER, UNATTRIBUTED},
        "class": frozenset(p.label for p in PriorityClass),
        "failure_class": frozenset(f.value for f in FailureClass),
        "reason": frozenset(r.value for r in UnloadReason),
        "waits_for": frozenset(w.value for w in WaitReason),
        "outcome": frozenset(o.value for o in UnloadOutcome),
        "state": frozenset(s.value for s in ResidentState),
        "kind": frozenset(k.value for k in RecordKind),
    }


class BudgetCollector(Collector):
    """Reads the gate's books at scrape time."""

    def __init__(self, gate: Gate) -> None:
        self.gate = gate

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        gate = self.gate
        core = gate.core
        now = gate.clock()
        up = GaugeMetricFamily("gpugate_nvml_up", "1 when the last NVML sample succeeded.")
        up.add_metric([], 0.0 if core.fault is not None else 1.0)
        yield up
        info = InfoMetricFamily("gpugate_gpu", "GPU identity.", labels=["gpu", "uuid", "name"])
        families = {
            name: GaugeMetricFamily(f"gpugate_{name}", doc, labels=labels)
            for name, doc, labels in (
                ("gpu_memory_total_bytes", "Device memory (NVML total).", ["gpu"]),
                ("gpu_memory_driver_reserved_bytes", "Reserved by driver and firmware.", ["gpu"]),
                ("gpu_memory_used_bytes", "Allocated, as NVML reports it.", ["gpu"]),
                ("gpu_memory_free_bytes", "Free, as NVML reports it.", ["gpu"]),
                ("sample_age_seconds", "Age of the NVML sample behind the budget.", ["gpu"]),
                (
                    "budget_external_bytes",
                    "Memory of processes the gate does not manage.",
                    ["gpu", "service"],
                ),
                ("budget_observed_bytes", "Memory NVML shows for a consumer.", ["gpu", "consumer"]),
                ("budget_resident_bytes", "Models the gate knows are loaded.", ["gpu", "consumer"]),
                (
                    "budget_leased_pending_bytes",
                    "Leased for loads not yet complete.",
                    ["gpu", "consumer"],
                ),
                (
                    "budget_committed_bytes",
                    "max(observed, resident + unexplained + leased).",
                    ["gpu", "consumer"],
                ),
                ("budget_reserve_bytes", "Safety margin, grown with external volatility.", ["gpu"]),
                (
                    "budget_schedulable_bytes",
                    "What a new load may take (negative: over-committed).",
                    ["gpu"],
                ),
                ("pressure", "1 while external use has eaten into the reserve.", ["gpu"]),
            )
        }
        for gpu in core.gpus():
            budget = core.budget(gpu)
            if budget is None:
                continue
            g = str(gpu)
            info.add_metric([g, budget.uuid, budget.name], {})
            families["gpu_memory_total_bytes"].add_metric([g], budget.total)
            families["gpu_memory_driver_reserved_bytes"].add_metric([g], budget.reserved)
            families["gpu_memory_used_bytes"].add_metric([g], budget.used)
            families["gpu_memory_free_bytes"].add_metric([g], budget.free)
            families["sample_age_seconds"].add_metric([g], core.sample_age(gpu, now) or 0.0)
            for row in budget.external:
                families["budget_external_bytes"].add_metric([g, row.name], row.bytes)
            for row in budget.consumers:
                families["budget_observed_bytes"].add_metric([g, row.name], row.observed)
                families["budget_resident_bytes"].add_metric([g, row.name], row.resident)
                families["budget_leased_pending_bytes"].add_metric([g, row.name], row.pending)
                families["budget_committed_bytes"].add_metric([g, row.name], row.committed)
            families["budget_reserve_bytes"].add_metric([g], budget.reserve)
            families["budget_schedulable_bytes"].add_metric([g], budget.schedulable)
            families["pressure"].add_metric([g], 1.0 if core.in_pressure(gpu) else 0.0)
        yield info
        yield from families.values()
        leases = GaugeMetricFamily(
            "gpugate_leases_active", "Requests in flight under a lease.", labels=["consumer"]
        )
        counts: dict[str, int] = {c.name: 0 for c in gate.config.consumers}
        for lease in core.leases():
            counts[lease.key.consumer] = counts.get(lease.key.consumer, 0) + 1
        for name, count in sorted(counts.items()):
            leases.add_metric([name], count)
        yield leases
        queued = GaugeMetricFamily(
            "gpugate_queue_tickets", "Requests waiting for a lease.", labels=["gpu", "class"]
        )
        # Every GPU and class has a sample, 0 when nothing waits: an empty queue is a
        # value, not a missing series (`absent` and `for` clauses need it).
        depth: dict[tuple[str, str], int] = {
            (str(gpu), klass.label): 0 for gpu in core.gpus() for klass in PriorityClass
        }
        for ticket in core.waiting():
            label = (str(ticket.demand.gpu), ticket.demand.priority.label)
            depth[label] = depth.get(label, 0) + 1
        for (g, klass), count in sorted(depth.items()):
            queued.add_metric([g, klass], count)
        yield queued
        yield _waiting_by_reason(gate)
        residents = GaugeMetricFamily(
            "gpugate_residents",
            "Models in VRAM by GPU and state (a model split across GPUs counts on each).",
            labels=["gpu", "consumer", "state"],
        )
        states: dict[tuple[str, str, str], int] = {}
        for resident in core.residents():
            label = (str(resident.gpu), resident.key.consumer, resident.state.value)
            states[label] = states.get(label, 0) + 1
        for label, count in sorted(states.items()):
            residents.add_metric(list(label), count)
        yield residents


class LeaseCollector(Collector):
    """Leases granted and their waits, from the gate's tally at scrape time."""

    def __init__(self, gate: Gate) -> None:
        self.gate = gate

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        tally = self.gate.events.tally
        granted = CounterMetricFamily(
            "gpugate_leases_granted", "Leases granted.", labels=["consumer", "class"]
        )
        for (consumer, klass), count in list(tally.granted.items()):
            granted.add_metric([consumer, label_of(klass)], count)
        yield granted
        wait = HistogramMetricFamily(
            "gpugate_lease_wait_seconds", "Time from arrival to lease.", labels=["class"]
        )
        bounds = [floatToGoString(b) for b in WAIT_BUCKETS] + ["+Inf"]
        for klass, (cumulative, total) in tally.histogram().items():
            wait.add_metric([klass], list(zip(bounds, cumulative, strict=True)), total)
        yield wait


class StoreCollector(Collector):
    """Reads the store's buffer and write outcomes at scrape time."""

    def __init__(self, gate: Gate) -> None:
        self.gate = gate

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        store = self.gate.store
        up = GaugeMetricFamily(
            "gpugate_store_up",
            "1 when the database is open, its writer runs and the last write succeeded.",
        )
        buffered = GaugeMetricFamily(
            "gpugate_store_buffered_records", "Records waiting to be written to the database."
        )
        failures = CounterMetricFamily(
            "gpugate_store_write_failures",
            "Database writes, opens and writer errors that failed (each retried with backoff).",
        )
        dropped = CounterMetricFamily(
            "gpugate_store_dropped",
            "Records given up: the buffer was full, the gate stopped first, or the database"
            " cannot take the record.",
            labels=["kind"],
        )
        if store is not None:
            up.add_metric([], 1.0 if store.healthy else 0.0)
            buffered.add_metric([], store.buffered)
            failures.add_metric([], store.write_failures)
            for kind in RecordKind:
                dropped.add_metric([kind.value], store.dropped[kind])
        yield from (up, buffered, failures, dropped)


class OperatorCollector(Collector):
    """What operators did that still holds (pauses, drains) and the gate's health, read at
    scrape time."""

    def __init__(self, gate: Gate) -> None:
        self.gate = gate

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        gate = self.gate
        core = gate.core
        paused = GaugeMetricFamily(
            "gpugate_gpu_paused",
            "1 while an operator has paused admission on the GPU (new loads wait).",
            labels=["gpu"],
        )
        seconds = GaugeMetricFamily(
            "gpugate_gpu_paused_seconds",
            "How long the GPU has been paused (0 while it admits).",
            labels=["gpu"],
        )
        held = set(core.operator.paused())
        for gpu in core.gpus():
            paused.add_metric([str(gpu)], 1.0 if gpu in held else 0.0)
            if gpu not in held:
                seconds.add_metric([str(gpu)], 0.0)
            elif (since := paused_seconds(gate, gpu)) is not None:
                seconds.add_metric([str(gpu)], since)
        yield paused
        yield seconds
        draining = GaugeMetricFamily(
            "gpugate_consumer_draining",
            "1 while an operator has the consumer draining (it admits nothing new).",
            labels=["consumer"],
        )
        for consumer in gate.config.consumers:
            draining.add_metric(
                [consumer.name], 1.0 if core.operator.draining(consumer.name)[0] else 0.0
            )
        yield draining
        healthy = GaugeMetricFamily(
            "gpugate_healthy", "1 when every check of /gate/v1/health passes (it answers 200)."
        )
        healthy.add_metric([], 1.0 if health_document(gate)["ok"] else 0.0)
        yield healthy
        yield lifecycle_metric(gate)


def lifecycle_metric(gate: Gate) -> GaugeMetricFamily:
    """`gpugate_runtime_state`: 1 on the state each runtime with a lifecycle is in, 0 on
    the others (every state has a sample, so a query by state never finds none)."""
    family = GaugeMetricFamily(
        "gpugate_runtime_state",
        "1 on the lifecycle state the runtime is in (stopped, starting, up, asleep, stopping).",
        labels=["consumer", "state"],
    )
    for consumer in gate.config.consumers:
        life = gate.core.lifecycle(consumer.name)
        if life is None:
            continue
        for state in LifeState:
            family.add_metric([consumer.name, state.value], 1.0 if life.state is state else 0.0)
    return family


class GateMetrics:
    """The registry served at /metrics."""

    def __init__(self, gate: Gate) -> None:
        # `_created` series double every counter for no use on a long-running daemon.
        disable_created_metrics()
        self.registry = CollectorRegistry()
        self.registry.register(BudgetCollector(gate))
        self.registry.register(StoreCollector(gate))
        self.registry.register(LeaseCollector(gate))
        self.registry.register(OperatorCollector(gate))
        r = self.registry
        self.failures = Counter(
            "gpugate_failures",
            "Requests failed at the gate, by class.",
            ["consumer", "failure_class"],
            registry=r,
        )
        self.evictions = Counter(
            "gpugate_evictions", "Unloads started, by reason.", ["consumer", "reason"], registry=r
        )
        self.reclaims = Counter(
            "gpugate_unloads_finished",
            "Unloads finished, by outcome.",
            ["consumer", "outcome"],
            registry=r,
        )
        self.offloads = Counter(
            "gpugate_partial_offloads", "Loads that spilled to the CPU.", ["consumer"], registry=r
        )
        self.out_of_band = Counter(
            "gpugate_out_of_band_loads",
            "Models found loaded without a lease.",
            ["consumer"],
            registry=r,
        )
        self.overruns = Counter(
            "gpugate_overruns",
            "Samples that showed a consumer holding more than its leases, by GPU.",
            ["consumer", "gpu"],
            registry=r,
        )
        self.degraded = Counter(
            "gpugate_degraded_grants",
            "Leases granted at their floor, their ceiling not to be had in time, by GPU.",
            ["consumer", "gpu"],
            registry=r,
        )
        self.rewarms = Counter(
            "gpugate_rewarms",
            "Kept-warm models evicted for a higher class and loaded again, by how it ended.",
            ["consumer", "gpu", "outcome"],
            registry=r,
        )
        self.swaps = Counter(
            "gpugate_swaps",
            "Models evicted for a request and loaded again on the same GPU within the queue's "
            "swap_window, by GPU.",
            ["consumer", "gpu"],
            registry=r,
        )
        # Not the routine lease events: those are counted in the gate's tally.
        gate.events.subscribe(self.on_event)

    def on_event(self, event: Event) -> None:
        consumer = event.consumer or GATE_WIDE
        if event.kind is EventKind.FAILURE and event.failure is not None:
            self.failures.labels(consumer, event.failure.failure_class.value).inc()
        elif event.kind is EventKind.EVICTION_STARTED:
            self.evictions.labels(consumer, UnloadReason(event.reason).value).inc()
        elif event.kind is EventKind.EVICTION_DONE:
            self.reclaims.labels(consumer, UnloadOutcome.of(event).value).inc()
        elif event.kind is EventKind.PARTIAL_OFFLOAD:
            self.offloads.labels(consumer).inc()
        elif event.kind is EventKind.OUT_OF_BAND_RESIDENT:
            self.out_of_band.labels(consumer).inc()
        elif event.kind is EventKind.OVERRUN:
            self.overruns.labels(consumer, str(event.gpu)).inc()
        elif event.kind is EventKind.DEGRADED:
            self.degraded.labels(consumer, str(event.gpu)).inc()
        elif event.kind in REWARM_ENDS:
            self.rewarms.labels(consumer, str(event.gpu), event.reason or "").inc()
        elif event.kind is EventKind.SWAP:
            self.swaps.labels(consumer, str(event.gpu)).inc()


def _waiting_by_reason(gate: Gate) -> GaugeMetricFamily:
    """`gpugate_queue_waiting`: the waiting demands by what they wait for, from the queue
    view `/gate/v1/queue` has (every GPU and reason a sample, 0 when none)."""
    family = GaugeMetricFamily(
        "gpugate_queue_waiting",
        "Requests waiting for a lease, by what they wait for.",
        labels=["gpu", "waits_for"],
    )
    counts = {(str(gpu), reason.value): 0 for gpu in gate.core.gpus() for reason in WaitReason}
    for row in queue(gate):
        label = (str(row.gpu), row.wait.reason.value)
        counts[label] = counts.get(label, 0) + 1
    for (g, waits_for), count in sorted(counts.items()):
        family.add_metric([g, waits_for], count)
    return family
