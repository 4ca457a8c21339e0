"""A 5,000-request slice of the oracle fuzzer (tests.faults.oracle_fuzz) in the test suite:
no request reaches a runtime's reader as a load without its lease, none the runtime refuses
is admitted, the simulated Ollama reads each request as the Go oracle does, and nothing else
the fuzzer checks goes wrong."""

from __future__ import annotations

import pytest

from tests.faults.oracle_fuzz import run
from tests.oracle.oracle import ORACLE_BINARY

pytestmark = pytest.mark.e2e

SEED = 20261202


@pytest.mark.skipif(not ORACLE_BINARY.exists(), reason="`make oracle` builds the Go oracle")
async def test_five_thousand_requests_against_the_oracles(tmp_path):
    report, cases = await run(5000, SEED, tmp_path)
    print(report.table())
    assert report.problems() == []
    assert len(cases) == 5000
    # The slice must exercise both sides of the promise, on both runtimes.
    assert report.loads_read > 100 and report.refusals_read > 1000
    # Both readers of Ollama requests are compared on loads, malformed bodies and refusals
    # made once the model is loaded.
    assert report.readings.compared > 1000 and report.readings.loads > 100
    assert report.readings.malformed > 100 and report.readings.refused_after_load > 0
    # How many prompts find room depends on timing (they compete with every load).
    assert report.prompts_queued >= 5 and report.prompts_refused >= 20
