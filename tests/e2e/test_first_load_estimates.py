"""Every model the demo loads through Ollama, and the llama-server tests' models on the
simulated llama-server: the gate's first-load estimate within 10 % of what the load took
(bench/estimates.py measures them; `python -m bench.estimates` prints the table)."""

from __future__ import annotations

from pathlib import Path

from bench.estimates import TOLERANCE, ollama_rows, sim_rows, table


def test_the_demos_ollama_models_are_estimated_as_they_load(tmp_path: Path) -> None:
    rows = ollama_rows(tmp_path)
    print("\n" + table(rows))
    names = {row.model for row in rows}
    assert names == {"gemma3:12b", "bge-m3", "llama3.2:3b", "qwen2.5:7b"}
    assert {row.source for row in rows} == {"GGUF blob", "/api/show"}
    for row in rows:
        assert row.within, f"{row.model} from {row.source}: {100 * row.error:+.1f} %"
    assert all(abs(row.error) <= TOLERANCE for row in rows)


def test_the_simulated_llama_server_holds_what_the_estimate_says(tmp_path: Path) -> None:
    rows = sim_rows(tmp_path)
    print("\n" + table(rows))
    assert len(rows) == 4
    for row in rows:
        assert row.within, f"{row.model}: {100 * row.error:+.1f} %"
