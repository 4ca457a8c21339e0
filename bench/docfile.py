"""Writing measured results into docs/benchmarks.md, each part between its own markers.

`make bench` fills every part; `python -m bench.NAME --write` fills its own part only, so
that one measurement can be run again without the others.
"""

from __future__ import annotations

from pathlib import Path

DOC = Path(__file__).resolve().parents[1] / "docs" / "benchmarks.md"


def write_section(name: str, text: str, doc: Path = DOC) -> None:
    """Replace what lies between `<!-- NAME:begin -->` and `<!-- NAME:end -->` with
    `text`; markers that are missing are added at the end of the file."""
    begin, end = f"<!-- {name}:begin -->", f"<!-- {name}:end -->"
    content = doc.read_text() if doc.exists() else "# Benchmarks\n"
    if begin not in content:
        content += f"\n{begin}\n{end}\n"
    head, rest = content.split(begin, 1)
    _, tail = rest.split(end, 1)
    doc.write_text(f"{head}{begin}\n{text.strip(chr(10))}\n{end}{tail}")
