"""Leases granted and their waits, counted in the gate's tally and exposed when scraped,
read exactly as prometheus_client's own Counter and Histogram fed grant by grant."""

from __future__ import annotations

import types

import hypothesis.strategies as st
from hypothesis import given
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.openmetrics.exposition import generate_latest as generate_openmetrics
from prometheus_client.parser import text_string_to_metric_families

from gpugate.control.metrics import LeaseCollector
from gpugate.core.classes import PriorityClass
from gpugate.core.scheduling import granted_event
from gpugate.core.tickets import Lease
from gpugate.gate.events import WAIT_BUCKETS, EventHub
from tests.core.builders import demand

FAMILIES = {"gpugate_leases_granted", "gpugate_lease_wait_seconds"}

grants = st.lists(
    st.tuples(
        st.sampled_from(("ollama", "comfyui")),
        st.sampled_from(list(PriorityClass)),
        st.one_of(
            st.just(0.0),
            st.sampled_from([float(b) for b in WAIT_BUCKETS]),
            st.floats(min_value=0.0, max_value=1000.0, allow_nan=False),
        ),
        st.booleans(),
    ),
    max_size=40,
)


def samples(text: str) -> list[tuple[str, tuple[tuple[str, str], ...], float]]:
    return sorted(
        (s.name, tuple(sorted(s.labels.items())), s.value)
        for family in text_string_to_metric_families(text)
        if family.name in FAMILIES
        for s in family.samples
    )


@given(grants)
def test_the_tally_reads_as_a_counter_and_a_histogram_fed_one_by_one(grants):
    reference = CollectorRegistry()
    counter = Counter(
        "gpugate_leases_granted", "Leases granted.", ["consumer", "class"], registry=reference
    )
    histogram = Histogram(
        "gpugate_lease_wait_seconds",
        "Time from arrival to lease.",
        ["class"],
        buckets=WAIT_BUCKETS,
        registry=reference,
    )
    hub = EventHub()
    for n, (consumer, klass, wait, resident) in enumerate(grants):
        counter.labels(consumer, klass.label).inc()
        histogram.labels(klass.label).observe(wait)
        wanted = demand("m", 100, consumer=consumer, priority=klass)
        lease = Lease(n, wanted, granted=10.0, waited=wait, pending=0, loads=False)
        if resident and wait == 0:
            hub.granted(lease)  # the resident path: counted, no event built
        else:
            hub.publish(granted_event(lease))
    served = CollectorRegistry()
    served.register(LeaseCollector(types.SimpleNamespace(events=hub)))  # type: ignore[arg-type]

    assert samples(generate_latest(served).decode()) == samples(generate_latest(reference).decode())
    openmetrics = generate_openmetrics(served).decode()
    assert "# TYPE gpugate_lease_wait_seconds histogram" in openmetrics
    assert ("gpugate_leases_granted_total" in openmetrics) == bool(grants)
