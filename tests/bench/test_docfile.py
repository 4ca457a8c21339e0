"""Each measurement writes its own part of docs/benchmarks.md and leaves the rest alone."""

from __future__ import annotations

from pathlib import Path

from bench.docfile import write_section


def test_a_part_is_replaced_between_its_markers(tmp_path: Path) -> None:
    doc = tmp_path / "benchmarks.md"
    doc.write_text(
        "# Benchmarks\n<!-- results:begin -->\nold\n<!-- results:end -->\nprose\n"
        "<!-- swaps:begin -->\nold swaps\n<!-- swaps:end -->\nmore prose\n"
    )
    write_section("swaps", "\n| a | b |\n|---|---|\n", doc)
    assert doc.read_text() == (
        "# Benchmarks\n<!-- results:begin -->\nold\n<!-- results:end -->\nprose\n"
        "<!-- swaps:begin -->\n| a | b |\n|---|---|\n<!-- swaps:end -->\nmore prose\n"
    )


def test_missing_markers_are_added_at_the_end(tmp_path: Path) -> None:
    doc = tmp_path / "benchmarks.md"
    doc.write_text("# Benchmarks\n")
    write_section("sampling", "table", doc)
    write_section("sampling", "newer table", doc)
    assert doc.read_text() == (
        "# Benchmarks\n\n<!-- sampling:begin -->\nnewer table\n<!-- sampling:end -->\n"
    )
