"""A short seeded slice of the incident trace (the full one runs in `make demo`)."""

from __future__ import annotations

import pytest

from tests.faults.trace import admitted_ooms, replay, trace_ops

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
