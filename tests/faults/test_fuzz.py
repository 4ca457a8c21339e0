"""A 1,000-request slice of `make fuzz` (tests.faults.fuzz) in the test suite."""

from __future__ import annotations

import pytest

from tests.faults.fuzz import run

pytestmark = pytest.mark.e2e

SEED = 20261201


async def test_a_thousand_hostile_requests(tmp_path):
    report = await run(1000, SEED, tmp_path)
    print(report.table())
    assert report.problems() == []
    assert sum(report.outcomes.values()) == 1000
