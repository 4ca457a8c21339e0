"""The real llama-server (its CPU build) on the tests' tiny models: the gate's estimate of
each load within 10 % of the buffers the server logged (bench/estimates.py)."""

from __future__ import annotations

from pathlib import Path

from bench.estimates import real_rows, table


def test_the_real_server_allocates_what_the_estimate_says(
    llama_server_binary: Path, tmp_path: Path
) -> None:
    rows = real_rows(llama_server_binary, tmp_path)
    print("\n" + table(rows))
    assert len(rows) == 4
    for row in rows:
        assert row.measured > 0, f"{row.model}: no buffer sizes in the server's log"
        assert row.within, f"{row.model}: {100 * row.error:+.1f} %"
