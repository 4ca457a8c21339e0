"""Every label value the gate exports comes from its declared closed set."""

from __future__ import annotations

import asyncio

import aiohttp
import ollama
from prometheus_client.parser import text_string_to_metric_families

from gpugate.control.metrics import GateMetrics, UnloadOutcome, label_sets
from gpugate.core.effects import Event, EventKind, UnloadReason
from gpugate.core.residents import ResidentKey
from gpugate.core.units import GiB
from tests.control.conftest import admin, trainer

CARD_LABELS = {"uuid", "name"}


async def test_after_evictions_failures_and_leases_every_label_is_from_its_set(stack):
    gate = stack.gate
    client = ollama.AsyncClient(host=stack.gate_url)
    # An idle background model, evicted for an interactive lease that needs its memory.
    await client.embed(model="bge-m3", input="x")
    await client.generate(model="gemma3:12b", prompt="x", options={"num_predict": 1})
    finished = gate.events.next(lambda e: e.kind is EventKind.EVICTION_DONE)
    lapsed = gate.events.next(lambda e: e.kind is EventKind.FAILURE)
    async with aiohttp.ClientSession() as session:
        async with session.post(
            stack.control_url + "/gate/v1/leases",
            json={"consumer": "ollama", "bytes": "5GiB", "max_wait": 20},
            headers=admin(),
        ) as resp:
            assert resp.status == 201, await resp.text()
        # An identity's lease nobody renews: LEASE_TIMEOUT, counted under its owner.
        async with session.post(
            stack.control_url + "/gate/v1/leases",
            json={"bytes": "1GiB", "ttl": 1},
            headers=trainer(),
        ) as resp:
            assert resp.status == 201, await resp.text()
        done = await asyncio.wait_for(finished, 10)
        await asyncio.wait_for(lapsed, 10)
        async with session.get(stack.control_url + "/metrics") as resp:
            text = await resp.text()

    declared = label_sets(gate.config, gate.core.gpus())
    seen: dict[str, set[str]] = {}
    for family in text_string_to_metric_families(text):
        if not family.name.startswith("gpugate_"):
            continue
        for sample in family.samples:
            for label, value in sample.labels.items():
                if label == "le" or label in CARD_LABELS:
                    continue
                assert label in declared, (sample.name, label)
                assert value in declared[label], (sample.name, label, value)
                seen.setdefault(label, set()).add(value)
    assert done.reason == UnloadReason.EVICTION.value
    # The run reached the labels this test is about.
    assert {"reclaimed"} <= seen["outcome"] or {"not_reclaimed"} <= seen["outcome"]
    assert "eviction" in seen["reason"]
    assert {"LEASE_TIMEOUT"} <= seen["failure_class"]
    assert "identity:trainer" in seen["consumer"]
    assert gate.core.budget(0).consumer("ollama").pending <= 5 * GiB


def test_an_unload_outcome_is_one_of_three_whatever_its_detail_says():
    key = ResidentKey("ollama", "m", "")
    details = {
        "reclaimed; 14.6 GiB schedulable after": UnloadOutcome.RECLAIMED,
        "not reclaimed; 2.0 GiB schedulable after": UnloadOutcome.NOT_RECLAIMED,
        "not reclaimed": UnloadOutcome.NOT_RECLAIMED,
        "unload failed: TIMEOUT; 1.0 GiB schedulable after": UnloadOutcome.FAILED,
        "reclaimed": UnloadOutcome.RECLAIMED,
    }
    for detail, outcome in details.items():
        event = Event(EventKind.EVICTION_DONE, 0.0, key=key, detail=detail)
        assert UnloadOutcome.of(event) is outcome, detail


def test_counters_fed_by_events_use_the_closed_sets():
    import types

    from gpugate.gate.events import EventHub

    hub = EventHub()
    metrics = GateMetrics(types.SimpleNamespace(events=hub))  # type: ignore[arg-type]
    key = ResidentKey("ollama", "m", "")
    for detail in ("reclaimed; 1 GiB schedulable after", "not reclaimed; 2 GiB after"):
        metrics.on_event(Event(EventKind.EVICTION_DONE, 0.0, key=key, detail=detail))
    metrics.on_event(Event(EventKind.EVICTION_DONE, 0.0, key=key, detail="not reclaimed"))
    values = {
        (s.labels["outcome"], s.value)
        for s in metrics.reclaims.collect()[0].samples
        if s.name.endswith("_total")
    }
    assert values == {("reclaimed", 1.0), ("not_reclaimed", 2.0)}
