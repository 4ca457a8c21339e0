"""Start the Ollama oracle (build/oracle/ollama-oracle) and read what it recorded.

The oracle is a Go reverse proxy that reads each request as Ollama v0.24.0 would and
records, before forwarding it, whether Ollama would have reached its scheduler with it,
with what keep_alive and runner options, and what it would refuse once the model loaded.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import attrs

from tests.sim.processes import LineReader

ROOT = Path(__file__).resolve().parents[2]
ORACLE_BINARY = ROOT / "build" / "oracle" / "ollama-oracle"


@attrs.frozen
class Record:
    """One request as the oracle saw it; `t` is when its head arrived (Unix seconds)."""

    t: float
    method: str
    path: str
    query: str
    case: str
    could_load: bool
    model: str
    reason: str
    undecided: bool = False
    host: str = ""
    origin: str = ""
    malformed: bool = False
    """The body did not decode into the route's request type (Ollama's 400)."""
    keep_alive: int | None = None
    """A load's keep_alive in nanoseconds; None: not given."""
    runner: dict[str, int | bool] | None = None
    """The runner options a load's request sets (api.Runner's, as Options.FromMap sets them)."""
    after_load: str = ""
    """The 500 Ollama answers once the model is loaded (a format or template it refuses)."""


def start_oracle(
    upstream_url: str,
    record_path: str | Path,
    *,
    listen: str = "127.0.0.1:0",
    binary: Path = ORACLE_BINARY,
    ready_timeout: float = 20.0,
) -> tuple[str, subprocess.Popen[str]]:
    """Start the oracle in front of `upstream_url`; its base URL and process, once it listens.

    The caller stops it (`process.terminate()` then `wait()`).
    """
    process = subprocess.Popen(
        [str(binary), "-listen", listen, "-upstream", upstream_url, "-record", str(record_path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    line = LineReader(process.stdout).until("READY ", timeout=ready_timeout)
    LineReader(process.stderr)  # drained so that its log never blocks it
    return line.split()[1], process


def read_records(path: str | Path) -> list[Record]:
    """Every complete line of the record file, in the order written."""
    records = []
    for line in Path(path).read_text().split("\n"):  # one per "\n": U+0085 may be in one
        if line.strip():
            records.append(Record(**json.loads(line)))
    return records
