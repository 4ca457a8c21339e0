"""An append-only file of JSON lines, one a request a simulated runtime acted on.

The oracle fuzzer (tests/faults/oracle_fuzz.py) reads them back to learn what each runtime
took as a load. Each line is one write(2) on an O_APPEND descriptor, unbuffered: it is whole
in the file before the answer leaves, and a reader never sees half of one.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import attrs


class RecordFile:
    """Lines of attrs records, appended."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._fd: int | None = os.open(
            path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644
        )

    def write(self, record: object) -> None:
        """Append one record (an attrs instance) as a JSON line."""
        if self._fd is None:
            return
        line = json.dumps(attrs.asdict(record)) + "\n"  # type: ignore[arg-type]
        os.write(self._fd, line.encode())

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
