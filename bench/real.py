"""The real runtimes the suite builds: what the gate adds to llama-server's and
whisper-server's requests over a direct connection, next to a bare pass-through.

    python -m bench.real [--requests N] [--rounds R] [--write]

The servers are the CPU builds `make bench` leaves in build/ (bench/real_rig.py), with
tiny models of random weights: a first token comes after a few milliseconds of
generation, a transcription of a 0.2 s clip after a few more, so what the path adds is
most of what differs. Requests are timed as bench/runtimes.py times them (one at a time,
the paths taking turns, medians of rounds). The client ACKs whisper-server's answers at
once on every path: whisper-server leaves Nagle on, and a client that does not gets each
answer 40 ms late on a reused connection (bench/reuse.py).
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

from bench.docfile import write_section
from bench.real_rig import RealRig
from bench.runtimes import (
    BOUNDARY,
    ROUNDS,
    Case,
    measure_apart_as,
    measure_cases,
    multipart,
    rows,
    wav,
)

REQUESTS = int(os.environ.get("BENCH_REAL_REQUESTS", "100"))
"""Requests per path per round: a transcription takes 0.1 to 0.2 s on one thread."""
LLAMA = "llama-server (real)"
WHISPER = "whisper-server (real)"
COMPLETION = json.dumps({"prompt": "hi", "n_predict": 2, "stream": True}).encode()
CLIP = multipart({"response_format": "json", "temperature": "0.0"}, wav(0.2))
FORM = f"multipart/form-data; boundary={BOUNDARY}"

CASES = (
    Case(LLAMA, "POST /completion, streamed, first token", "POST", "/completion", COMPLETION,
         streamed=True, target_ms=0.3, ends_streams=True),
    Case(LLAMA, "GET /health", "GET", "/health", target_ms=0.3, target_note="pass-through"),
    Case(WHISPER, "GET /health", "GET", "/health", target_ms=1.0, quick_ack=True),
    Case(WHISPER, "POST /inference, 0.2 s clip", "POST", "/inference", CLIP, FORM,
         target_ms=1.0, quick_ack=True),
)  # fmt: skip
FIRST = {
    "llama": ("/completion", b'{"prompt": "hi", "n_predict": 1}', "application/json"),
    "whisper": ("/inference", CLIP, FORM),
}
"""A request that runs each model: the gate starts each server on the first."""


def measure(requests: int = REQUESTS, rounds: int = ROUNDS) -> list[dict[str, object]]:
    """Every case on the real runtimes' rig."""
    return measure_cases(lambda tmp: RealRig(tmp, FIRST), CASES, requests, rounds)


def measure_apart(requests: int = REQUESTS, rounds: int = ROUNDS) -> list[dict[str, object]]:
    """`measure` in a new Python process."""
    return measure_apart_as("bench.real", requests, rounds)


def table(results: list[dict[str, object]]) -> list[str]:
    """The section's lines for docs/benchmarks.md."""
    requests, rounds = results[0]["requests"], results[0]["rounds"]
    return [
        "",
        f"Measured {time.strftime('%Y-%m-%d')}. The real runtimes the suite builds "
        "(bench/real_rig.py: llama-server and whisper-server, CPU builds, tiny models of "
        "random weights, started by the gate as process consumers), timed as the simulated "
        f"runtimes are: {requests} requests per path per round, {rounds} round(s); ms; "
        "the client ACKs whisper-server's answers at once on every path:",
        "",
        "| runtime | route | direct p50 / p99 | bare pass-through p50 / p99 | gpugate p50 / p99 "
        "| bare added p50 | gpugate added p50 / p99 | CPU µs/req bare / gpugate | target "
        "| met |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---|",
        *rows(results),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=REQUESTS)
    parser.add_argument("--rounds", type=int, default=ROUNDS)
    parser.add_argument("--json", help="write the results here as JSON")
    parser.add_argument("--write", action="store_true", help="update docs/benchmarks.md")
    args = parser.parse_args()
    results = measure(args.requests, args.rounds)
    if args.json:
        Path(args.json).write_text(json.dumps(results))
    print("\n".join(table(results)))
    if args.write:
        write_section("real", "\n".join(table(results)))


if __name__ == "__main__":
    main()
