"""Every runtime's path: what the gate adds to a request over a direct connection, next
to what a bare aiohttp pass-through adds, for ComfyUI, Ollama, whisper-server and
llama-server.

    python -m bench.runtimes [--requests N] [--rounds R]

The runtimes are simulated (bench/runtime_rig.py). Each route is asked N times per path
per round, one request at a time on a kept-alive connection per path, the paths taking
turns request by request (the order rotating), so that a drift of the machine's speed
falls on all three alike. For each path and round: the median and p99; the figures given
are the median of the rounds', and "added" is the median of the rounds' differences to
direct. A streamed answer is timed to its first body bytes (the first token, or the
first event); anything else to its last byte.

Whisper-server's cold start comes from bench/coldstart.py (a run of its own).
"""

from __future__ import annotations

import argparse
import io
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import wave
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Protocol

import attrs

from bench.coldstart import ColdStart
from bench.coldstart import measure_apart as coldstart_apart
from bench.docfile import write_section
from bench.httpclient import Connection
from bench.runtime_rig import LLAMA_MODEL, OLLAMA_MODEL, SD15, Paths, RuntimeRig
from bench.targets import LOAD_CPU
from tests.sim.comfyui_helpers import flux

REQUESTS = int(os.environ.get("BENCH_RUNTIME_REQUESTS", "200"))
ROUNDS = int(os.environ.get("BENCH_ROUNDS", "3"))
PATHS = ("direct", "bare", "gate")
LABELS = {"direct": "direct", "bare": "bare pass-through", "gate": "gpugate"}
WARMUP = 20
BOUNDARY = "gpugatebench"
TICK = os.sysconf("SC_CLK_TCK")


@attrs.frozen
class Case:
    """One route of one runtime, and what the gate may add to it."""

    runtime: str
    route: str
    method: str
    path: str
    body: bytes = b""
    content_type: str = "application/json"
    streamed: bool = False
    target_ms: float | None = None
    target_note: str = ""
    quick_ack: bool = False
    """The client ACKs each answer as it arrives (bench/httpclient.py): the real
    whisper-server, whose answers to a client that does not wait 40 ms each."""
    ends_streams: bool = False
    """The server ends the connection after a chunked answer (the real llama-server): a
    client whose connection it ended opens a new one inside the next request's clock
    (bench/httpclient.py); one kept by a proxy does not."""


def wav(seconds: float = 0.2) -> bytes:
    """A silent 16 kHz mono WAV."""
    out = io.BytesIO()
    with wave.open(out, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(16000)
        w.writeframes(b"\0\0" * int(16000 * seconds))
    return out.getvalue()


def multipart(fields: dict[str, str], audio: bytes) -> bytes:
    """A transcription form as curl or a browser sends it: the file and a few fields."""
    parts = [
        f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="{name}"\r\n\r\n{value}\r\n'.encode()
        for name, value in fields.items()
    ]
    parts.append(
        f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="file"; filename="a.wav"\r\n'
        "Content-Type: audio/wav\r\n\r\n".encode()
        + audio
        + b"\r\n"
    )
    return b"".join(parts) + f"--{BOUNDARY}--\r\n".encode()


def sd15_prompt() -> bytes:
    """The stock SD1.5 text-to-image workflow in API format, 512×512, 4 steps."""
    graph = {
        "4": {"class_type": "CheckpointLoaderSimple", "inputs": {"ckpt_name": SD15}},
        "6": {"class_type": "CLIPTextEncode", "inputs": {"text": "a cat", "clip": ["4", 1]}},
        "7": {"class_type": "CLIPTextEncode", "inputs": {"text": "", "clip": ["4", 1]}},
        "5": {"class_type": "EmptyLatentImage",
              "inputs": {"width": 512, "height": 512, "batch_size": 1}},
        "3": {"class_type": "KSampler",
              "inputs": {"model": ["4", 0], "seed": 1, "steps": 4, "cfg": 8.0,
                         "sampler_name": "euler", "scheduler": "normal", "positive": ["6", 0],
                         "negative": ["7", 0], "latent_image": ["5", 0], "denoise": 1.0}},
        "8": {"class_type": "VAEDecode", "inputs": {"samples": ["3", 0], "vae": ["4", 2]}},
        "9": {"class_type": "SaveImage",
              "inputs": {"images": ["8", 0], "filename_prefix": "bench"}},
    }  # fmt: skip
    return json.dumps({"prompt": graph, "client_id": "bench"}).encode()


def flux_prompt() -> bytes:
    """FLUX.1-dev's workflow in API format (UNet, both text encoders, VAE), 1024×1024."""
    return json.dumps({"prompt": flux(), "client_id": "bench"}).encode()


def chat(model: str) -> bytes:
    messages = [{"role": "user", "content": "hi"}]
    body = {"model": model, "messages": messages, "stream": True, "max_tokens": 2}
    return json.dumps(body).encode()


CASES = (
    Case("ComfyUI", "POST /prompt (SD1.5)", "POST", "/prompt", sd15_prompt(), target_ms=1.0),
    Case("ComfyUI", "POST /prompt (FLUX)", "POST", "/prompt", flux_prompt(), target_ms=1.0),
    Case("ComfyUI", "GET /history", "GET", "/history?max_items=1", target_ms=0.3,
         target_note="pass-through"),
    Case("Ollama", "POST /api/generate, first token", "POST", "/api/generate",
         json.dumps({"model": OLLAMA_MODEL, "prompt": "hi", "stream": True,
                     "options": {"num_predict": 2}}).encode(), streamed=True, target_ms=0.3),
    Case("Ollama", "POST /v1/chat/completions, first token", "POST", "/v1/chat/completions",
         chat(OLLAMA_MODEL), streamed=True, target_ms=0.3),
    Case("whisper-server", "POST /inference, warm", "POST", "/inference",
         multipart({"response_format": "json", "temperature": "0.0"}, wav()),
         f"multipart/form-data; boundary={BOUNDARY}"),
    Case("llama-server", "POST /v1/chat/completions, first token", "POST",
         "/v1/chat/completions", chat(LLAMA_MODEL), streamed=True, target_ms=0.3,
         target_note="as Ollama's"),
    Case("llama-server", "GET /health", "GET", "/health", target_ms=0.3,
         target_note="pass-through"),
)  # fmt: skip
RUNTIME_KEY = {"ComfyUI": "comfyui", "Ollama": "ollama", "whisper-server": "whisper",
               "llama-server": "llama", "llama-server (real)": "llama",
               "whisper-server (real)": "whisper"}  # fmt: skip


def p99(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]


def cpu_seconds(pid: int) -> float:
    """User and system time of one process, all its threads, none of its children."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def run_case(case: Case, paths: Paths, requests: int, rounds: int) -> dict[str, object]:
    """Medians and p99s (ms) per path and round, the paths interleaved request by request;
    the CPU each proxy spent per request (µs)."""
    key = RUNTIME_KEY[case.runtime]
    proxies = {"bare": paths.pids[key], "gate": paths.pids["gate"]}
    conns = {
        path: Connection(
            paths.of(path)[key], quick_ack=case.quick_ack, ends_streams=case.ends_streams
        )
        for path in PATHS
    }
    per_round: dict[str, list[tuple[float, float]]] = {path: [] for path in PATHS}
    try:
        for path in PATHS:
            for _ in range(WARMUP):
                timed = conns[path].request(case.method, case.path, case.body, case.content_type)
                if timed.status != 200:
                    raise RuntimeError(f"{case.route} via {path}: {timed.status} {timed.body!r}")
        cpu = {path: cpu_seconds(pid) for path, pid in proxies.items()}
        for _ in range(rounds):
            samples: dict[str, list[float]] = {path: [] for path in PATHS}
            for i in range(requests):
                for k in range(len(PATHS)):
                    path = PATHS[(i + k) % len(PATHS)]
                    timed = conns[path].request(
                        case.method, case.path, case.body, case.content_type
                    )
                    if timed.status != 200:
                        raise RuntimeError(f"{case.route} via {path}: HTTP {timed.status}")
                    samples[path].append(
                        (timed.first_body if case.streamed else timed.complete) * 1000
                    )
            for path in PATHS:
                per_round[path].append((statistics.median(samples[path]), p99(samples[path])))
        cpu = {path: cpu_seconds(pid) - cpu[path] for path, pid in proxies.items()}
    finally:
        for conn in conns.values():
            conn.close()
    result: dict[str, object] = {
        "case": attrs.asdict(case, filter=lambda a, _: a.name != "body"),
        "requests": requests,
        "rounds": rounds,
    }
    for path in PATHS:
        result[path] = {
            "p50_ms": statistics.median(m for m, _ in per_round[path]),
            "p99_ms": statistics.median(p for _, p in per_round[path]),
        }
        if path != "direct":
            result[path]["cpu_us"] = cpu[path] / (requests * rounds) * 1e6  # type: ignore[index]
            direct = per_round["direct"]
            result[path]["added_p50_ms"] = statistics.median(  # type: ignore[index]
                m - d for (m, _), (d, _) in zip(per_round[path], direct, strict=True)
            )
            result[path]["added_p99_ms"] = statistics.median(  # type: ignore[index]
                p - d for (_, p), (_, d) in zip(per_round[path], direct, strict=True)
            )
    return result


class Rig(Protocol):
    """Processes that give the three ways to each runtime (runtime_rig.py, real_rig.py)."""

    def start(self) -> Paths: ...
    def stop(self) -> None: ...


def measure_cases(
    rig_of: Callable[[Path], Rig], cases: Sequence[Case], requests: int, rounds: int
) -> list[dict[str, object]]:
    """Every case on one rig made in a temporary directory; the client on the load
    generator's core."""
    pinned = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {LOAD_CPU})
    try:
        with tempfile.TemporaryDirectory(prefix="gpugate-bench-") as tmp:
            rig = rig_of(Path(tmp))
            try:
                paths = rig.start()
                results = []
                for case in cases:
                    began = time.monotonic()
                    results.append(run_case(case, paths, requests, rounds))
                    print(case.route, f"{time.monotonic() - began:.1f}s", file=sys.stderr)
                return results
            finally:
                rig.stop()
    finally:
        os.sched_setaffinity(0, pinned)


def measure_apart_as(
    module: str, requests: int, rounds: int, *extra: str
) -> list[dict[str, object]]:
    """The measurement `python -m MODULE` makes, in a Python process of its own, its
    results through a file (a simulated host writes its own lines to the output, which is
    shown only when the run fails)."""
    with tempfile.NamedTemporaryFile(prefix="gpugate-bench-", suffix=".json") as out:
        done = subprocess.run(
            [sys.executable, "-m", module, "--requests", str(requests),
             "--rounds", str(rounds), "--json", out.name, *extra],
            capture_output=True,
            text=True,
        )  # fmt: skip
        if done.returncode != 0:
            tail = "\n".join((done.stdout + done.stderr).splitlines()[-40:])
            raise RuntimeError(f"{module} failed ({done.returncode}):\n{tail}")
        return json.loads(Path(out.name).read_text())


def measure(requests: int = REQUESTS, rounds: int = ROUNDS) -> list[dict[str, object]]:
    """Every case, on the simulated runtimes' rig."""
    return measure_cases(RuntimeRig, CASES, requests, rounds)


def measure_apart(requests: int = REQUESTS, rounds: int = ROUNDS) -> list[dict[str, object]]:
    """`measure` in a new Python process."""
    return measure_apart_as("bench.runtimes", requests, rounds, "--no-coldstart")


def verdict(added: float, target: float | None) -> str:
    if target is None:
        return "—"
    return "met" if added <= target else "missed"


def table(results: list[dict[str, object]], coldstart: ColdStart | None) -> list[str]:
    """The section's lines for docs/benchmarks.md."""
    requests, rounds = results[0]["requests"], results[0]["rounds"]
    lines = [
        "",
        f"Measured {time.strftime('%Y-%m-%d')}. "
        "Every runtime's path (simulated runtimes, bench/runtime_rig.py): one request at a "
        "time on a kept-alive connection per path, the paths taking turns request by "
        f"request, {requests} requests per path per round, {rounds} round(s); ms, the median "
        "of the rounds' p50 and p99; added: the median of the rounds' differences to "
        "direct. Streamed answers are timed to their first body bytes, others to their "
        "last. CPU: what the proxy process spent per request (user + system, from /proc; "
        "the gate's includes its idle work over the same time):",
        "",
        "| runtime | route | direct p50 / p99 | bare pass-through p50 / p99 | gpugate p50 / p99 "
        "| bare added p50 | gpugate added p50 / p99 | CPU µs/req bare / gpugate | target "
        "| met |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    lines += rows(results)
    if coldstart is not None:
        lines.append(
            f"| whisper-server | cold start (spawn or request → first transcription) | "
            f"{coldstart.direct_ms:.1f} | — | {coldstart.gate_ms:.1f} | — | "
            f"{coldstart.added_ms:+.1f} (quartiles {coldstart.added_low_ms:+.1f} … "
            f"{coldstart.added_high_ms:+.1f}) | — | ≤ +100 ms | "
            f"{verdict(coldstart.added_ms, 100.0)} |"
        )
    return lines


def rows(results: list[dict[str, object]]) -> list[str]:
    """One table row per case: each path's p50 / p99, what each proxy adds, the target."""
    lines = []
    for result in results:
        case = result["case"]  # type: ignore[index]
        d, b, g = result["direct"], result["bare"], result["gate"]  # type: ignore[index]
        target = case["target_ms"]  # type: ignore[index]
        note = f" ({case['target_note']})" if case["target_note"] else ""  # type: ignore[index]
        goal = "—" if target is None else f"≤ +{target:g} ms{note}"
        lines.append(
            f"| {case['runtime']} | {case['route']} | "  # type: ignore[index]
            f"{d['p50_ms']:.2f} / {d['p99_ms']:.2f} | {b['p50_ms']:.2f} / {b['p99_ms']:.2f} | "  # type: ignore[index]
            f"{g['p50_ms']:.2f} / {g['p99_ms']:.2f} | {b['added_p50_ms']:+.2f} | "  # type: ignore[index]
            f"{g['added_p50_ms']:+.2f} / {g['added_p99_ms']:+.2f} | "  # type: ignore[index]
            f"{b['cpu_us']:.0f} / {g['cpu_us']:.0f} | {goal} | "  # type: ignore[index]
            f"{verdict(g['added_p50_ms'], target)} |"  # type: ignore[index]
        )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=REQUESTS)
    parser.add_argument("--rounds", type=int, default=ROUNDS)
    parser.add_argument("--json", help="write the results here as JSON")
    parser.add_argument("--no-coldstart", action="store_true", help="leave the cold start out")
    parser.add_argument("--write", action="store_true", help="update docs/benchmarks.md")
    args = parser.parse_args()
    results = measure(args.requests, args.rounds)
    if args.json:
        Path(args.json).write_text(json.dumps(results))
    coldstart = None if args.no_coldstart else coldstart_apart()
    print("\n".join(table(results, coldstart)))
    if args.write:
        write_section("runtimes", "\n".join(table(results, coldstart)))


if __name__ == "__main__":
    main()
