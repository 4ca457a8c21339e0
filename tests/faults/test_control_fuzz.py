"""A 1,000-request slice of the control listener's fuzz (tests.faults.control_fuzz) in the
test suite: no 5xx, no traceback, every refusal in the API's shape, nothing left leased."""

from __future__ import annotations

import pytest

from tests.faults.control_fuzz import run

pytestmark = pytest.mark.e2e

SEED = 20261203


async def test_a_thousand_hostile_control_requests(tmp_path):
    report = await run(1000, SEED, tmp_path)
    print(report.table())
    assert report.problems() == []
    assert sum(report.outcomes.values()) == 1000
    assert report.gate_5xx == [] and report.tracebacks == 0 and report.off_shape == []
    # The slice reaches the lease handler's refusals, not only the token check's.
    assert report.outcomes["POST 400 BAD_REQUEST"] > 100
