"""Short seeded slices of the trace, on the incident card and on the two-card host (the
whole ones run in `make demo`)."""

from __future__ import annotations

import pytest

from tests.faults.trace import admitted_ooms, replay, trace_ops
from tests.faults.trace_hosts import TWO

pytestmark = pytest.mark.e2e

SEED = 20260729


async def test_the_trace_hits_ooms_direct_and_none_through_the_gate():
    ops = trace_ops(100, SEED)
    assert ops == trace_ops(100, SEED), "seeded: the same trace every time"
    direct = await replay(ops, gated=False, seed=SEED)
    gated = await replay(ops, gated=True, seed=SEED)
    assert admitted_ooms(direct["ooms"]) > 0
    assert admitted_ooms(gated["ooms"]) == 0, gated["ooms"]
    assert gated["left"] == [], "nothing left leased at the end"
    assert gated["tracebacks"] == [], gated["tracebacks"][0]
    counted = gated["overruns"]
    assert counted.scraped <= counted.seen, "/metrics counted an overrun the log lacks"


async def test_on_two_cards_the_trace_hits_ooms_direct_and_none_through_the_gate():
    """The same home server with a second card: Ollama places and splits models over both,
    ComfyUI renders on one, whisper restarts on the other, Plex transcodes beside it."""
    ops = trace_ops(100, SEED)
    direct = await replay(ops, gated=False, seed=SEED, host=TWO)
    gated = await replay(ops, gated=True, seed=SEED, host=TWO)
    assert admitted_ooms(direct["ooms"]) > 0
    assert admitted_ooms(gated["ooms"]) == 0, gated["ooms"]
    assert sum(gated["by_card"].values()) == 0
    assert gated["left"] == [], "nothing left leased at the end"
    assert gated["tracebacks"] == [], gated["tracebacks"][0]
    counted = gated["overruns"]
    assert counted.scraped <= counted.seen, "/metrics counted an overrun the log lacks"
