"""The gate's overruns in a gated run of the seeded trace (tests/faults/trace.py).

An `overrun` event (gpugate/core/overrun.py) says a consumer holds more on a card than the
gate leased it. Counted per card, and how many were corrected: followed by an
`envelope_measured` event for the same consumer on that card (and the same model, where the
overrun could name one), the books taking the runtime's own figure for what it holds
(gpugate/core/listing.py). The events are read from the gate's log, one JSON line each on
its stderr, up to its exit: the events API keeps only the last 500, and `/metrics`
(`gpugate_overruns`), read once the trace's operations are done, misses what a sample
notices while the gate shuts down; it is kept as a check (never more than the log).
"""

from __future__ import annotations

import contextlib
import json
from collections import Counter

import aiohttp
import attrs
from prometheus_client.parser import text_string_to_metric_families

from tests.faults.trace_hosts import TraceHost
from tests.sim.processes import LineReader


@attrs.frozen
class Overruns:
    """The gate's overrun events of a run, per card."""

    seen: Counter[int]
    """The overrun events in the gate's log."""
    corrected: Counter[int]
    """Those followed by an envelope_measured event for the same consumer on that card
    (the same model, where the overrun named one)."""
    scraped: Counter[int]
    """As /metrics counted them when the operations were done (summed over consumers)."""


async def overruns_counted(session: aiohttp.ClientSession, control: str) -> Counter[int]:
    """The gate's overrun count per card, from its /metrics."""
    async with session.get(control + "/metrics") as r:
        return overruns_in(await r.text())


def overruns_in(text: str) -> Counter[int]:
    """`gpugate_overruns` per card in a /metrics page, summed over consumers."""
    counted: Counter[int] = Counter()
    for family in text_string_to_metric_families(text):
        if family.name == "gpugate_overruns":
            for sample in family.samples:
                if sample.name == "gpugate_overruns_total":
                    counted[int(sample.labels["gpu"])] += int(sample.value)
    return counted


def logged_events(log: LineReader, others: list[str] | None = None) -> list[dict]:
    """The events the gate logged, in order, once it has exited (its stderr at EOF);
    the lines that are no event go to `others` (a traceback is one)."""
    events = []
    while (line := log.next(timeout=30)) is not None:
        if line.startswith("{"):
            with contextlib.suppress(ValueError):
                events.append(json.loads(line))
                continue
        if others is not None:
            others.append(line)
    return events


def overruns(scraped: Counter[int], events: list[dict]) -> Overruns:
    """The overruns of a gated run: the logged ones, and which of them a measured envelope
    followed; `scraped`, what /metrics said before the gate stopped."""
    seen: Counter[int] = Counter()
    corrected: Counter[int] = Counter()
    for i, event in enumerate(events):
        if event.get("event") != "overrun":
            continue
        seen[event["gpu"]] += 1
        if any(
            later.get("event") == "envelope_measured"
            and later.get("consumer") == event.get("consumer")
            and later.get("gpu") == event.get("gpu")
            and event.get("model") in (None, later.get("model"))
            for later in events[i + 1 :]
        ):
            corrected[event["gpu"]] += 1
    return Overruns(seen, corrected, scraped)


def overrun_rows(counted: Overruns, host: TraceHost) -> list[str]:
    """The gated run's overruns, seen and corrected, per card on a host with more than one."""
    rows = [
        f"{'gate overruns seen':28} {'-':>10} {counted.seen.total():>10}",
        *(
            f"{f'  on GPU {card}':28} {'-':>10} {counted.seen.get(card, 0):>10}"
            for card in range(host.cards)
            if host.cards > 1
        ),
        f"{'  of which corrected':28} {'-':>10} {counted.corrected.total():>10}",
        *(
            f"{f'  on GPU {card}':28} {'-':>10} {counted.corrected.get(card, 0):>10}"
            for card in range(host.cards)
            if host.cards > 1
        ),
    ]
    if counted.scraped != counted.seen:
        scraped = counted.scraped.total()
        rows.append(f"{'  by /metrics before exit':28} {'-':>10} {scraped:>10}")
    return rows
