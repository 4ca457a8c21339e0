"""The Go dialect against Go's net/http on corpus cases with a few bytes changed.

3,000 mutations (three fixed seeds) of the corpus's connections: a byte or a token inserted,
deleted or replaced where no case put one. Both servers must answer every one alike.
"""

from __future__ import annotations

import pytest

from tests.dialects.corpus_go import mutations
from tests.dialects.wire import exchange


@pytest.mark.parametrize("seed", [20261207, 20261208, 20261209])
def test_mutated_cases_answer_as_go(
    seed: int, oracle: tuple[str, int], subject: tuple[str, int]
) -> None:
    cases = mutations(seed, 1_000)
    differ = []
    for case in cases:
        expected, got = exchange(oracle, case.data), exchange(subject, case.data)
        assert expected.ended != "open", case.name
        if got != expected:
            differ.append((case.name, case.data[:200], expected.data[:200], got.data[:200]))
    assert differ == []
    assert len(cases) == 1_000
