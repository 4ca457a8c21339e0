"""`make bench`: the gate against a direct connection, a bare aiohttp pass-through and nginx.

Everything runs on this machine at once. The proxy under test gets a core of its own;
the load generator and the upstream share the other (on a machine with one core, all
share it). Targets are measured in interleaved rounds and the median kept, so a burst of
noise does not land on one of them only. Only ratios measured in the same run mean
anything. Results are printed and written into docs/benchmarks.md between its markers.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from bench.decisions import measure as measure_decisions
from bench.decisions import table as decisions_table
from gpugate.core.units import GiB
from gpugate.sim.device import SimDevice, SimulatedGpuHost
from gpugate.sim.shim import STATE_ENV, library_path

ROOT = Path(__file__).resolve().parents[1]
WRK = ROOT / "build" / "wrk" / "usr" / "bin" / "wrk"
WRK_LIB = ROOT / "build" / "wrk" / "usr" / "lib" / "x86_64-linux-gnu"
NGINX = ROOT / "build" / "nginx" / "usr" / "sbin" / "nginx"
DOC = ROOT / "docs" / "benchmarks.md"
DURATION = int(os.environ.get("BENCH_SECONDS", "3"))
ROUNDS = int(os.environ.get("BENCH_ROUNDS", "3"))
FLOOR = "bare pass-through (asyncio)"
CEILING = "nginx"
CONNECTIONS = (1, 16, 64)
CPUS = sorted(os.sched_getaffinity(0))
LOAD_CPU = CPUS[0]
PROXY_CPU = CPUS[-1]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_http(url: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(url, timeout=1):
                return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def start(argv: list[str], cpu: int, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        argv,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        preexec_fn=lambda: os.sched_setaffinity(0, {cpu}),
    )


def median_of(runs: list[dict[str, float]]) -> dict[str, float]:
    return {key: statistics.median(run[key] for run in runs) for key in runs[0]}


def gate_config(port: int, control: int, upstream: int, path: Path) -> Path:
    path.write_text(f"""\
gate:
  control: 127.0.0.1:{control}
  shutdown_grace: 2s
budget:
  reserve: 1GiB
  reserve_max: 1GiB
consumers:
  ollama:
    runtime: ollama
    listen: 127.0.0.1:{port}
    upstream: http://127.0.0.1:{upstream}
    processes: {{commands: ["bench.upstream"]}}
    models:
      bench: {{envelope: 1GiB}}
""")
    return path


def nginx_binary() -> Path | None:
    """Debian's nginx unpacked by `make bench`, else one installed on the machine."""
    if NGINX.exists():
        return NGINX
    found = shutil.which("nginx")
    return Path(found) if found else None


def nginx_config(port: int, upstream: int, tmp: Path) -> Path:
    """A plain reverse proxy: keepalive to the upstream, nothing buffered, upgrades passed."""
    home = tmp / "nginx"
    home.mkdir()
    temp = "\n".join(
        f"  {kind}_temp_path {home / kind};"
        for kind in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi")
    )
    path = home / "nginx.conf"
    path.write_text(f"""\
daemon off;
master_process off;
worker_processes 1;
pid {home / "nginx.pid"};
error_log {home / "error.log"} warn;
events {{ worker_connections 4096; }}
http {{
  access_log off;
{temp}
  map $http_upgrade $connection_upgrade {{ default upgrade; '' ''; }}
  upstream backend {{ server 127.0.0.1:{upstream}; keepalive 128; }}
  server {{
    listen 127.0.0.1:{port};
    location / {{
      proxy_pass http://backend;
      proxy_http_version 1.1;
      proxy_set_header Host $host;
      proxy_set_header Upgrade $http_upgrade;
      proxy_set_header Connection $connection_upgrade;
      proxy_buffering off;
      proxy_request_buffering off;
      proxy_read_timeout 300s;
    }}
  }}
}}
""")
    return path


def ratio(value: float, reference: float) -> str:
    return f"{value / reference:.2f}x" if reference else "—"


def wait_resident(control: int) -> None:
    """The gate lists the upstream's model as resident, so requests lease 0 bytes."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        with urllib.request.urlopen(f"http://127.0.0.1:{control}/gate/v1/status") as resp:
            if json.load(resp)["residents"]:
                return
        time.sleep(0.1)
    raise RuntimeError("the gate never saw the benchmark model as resident")


def wrk(url: str, connections: int) -> dict[str, float]:
    env = {**os.environ, "LD_LIBRARY_PATH": str(WRK_LIB)}
    argv = [
        str(WRK),
        "-t1",
        f"-c{connections}",
        f"-d{DURATION}s",
        "--latency",
        "-s",
        str(ROOT / "bench" / "post.lua"),
        url + "/api/generate",
    ]
    subprocess.run([*argv[:3], "-d1s", *argv[4:]], env=env, capture_output=True, check=True)
    out = subprocess.run(argv, env=env, capture_output=True, text=True, check=True).stdout
    rate = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))  # type: ignore[union-attr]
    errors = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    if errors:
        raise RuntimeError(f"{url}: {errors.group(1)} failed requests\n{out}")

    def latency(pct: str) -> float:
        value, unit = re.search(rf"{pct}%\s+([\d.]+)(us|ms|s)", out).groups()  # type: ignore[union-attr]
        return float(value) * {"us": 0.001, "ms": 1.0, "s": 1000.0}[unit]

    return {"rps": rate, "p50_ms": latency("50"), "p99_ms": latency("99")}


def streams(url: str) -> dict[str, float]:
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench.streams",
            "--url",
            url,
            "--streams",
            "64",
            "--chunks",
            "100",
            "--interval",
            "0.02",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return json.loads(out)


WS_FPS = 1000
WS_FRAME = 64 * 1024


def ws_bench(url: str, *extra: str) -> dict[str, float]:
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench.ws",
            "--url",
            url.replace("http://", "ws://"),
            "--fps",
            str(WS_FPS),
            "--size",
            str(WS_FRAME),
            "--seconds",
            str(DURATION),
            *extra,
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return json.loads(out)


def ws_table(results: dict[str, dict[str, object]]) -> list[str]:
    floor = results["direct"]["ws"]  # type: ignore[index]
    lines = [
        "",
        f"One websocket of {WS_FRAME // 1024} KiB binary preview frames, {WS_FPS:,} a second "
        f"for {DURATION} s (ComfyUI's preview stream, heavier than ComfyUI sends): latency "
        "from the upstream's send to the client's receive, and what the proxy adds to "
        "direct's; the proxy's peak RSS growth while its client reads 50 frames a second "
        "from an upstream that sends as fast as they drain, for the same time:",
        "",
        "| path | frames/s | p50 ms | p99 ms | added p50 ms | added p99 ms | RSS growth, slow |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for name, result in results.items():
        row = result["ws"]  # type: ignore[index]
        slow = result.get("ws_slow")
        growth = f"{slow['rss_growth_mib']:.1f} MiB" if slow else "—"  # type: ignore[index]
        lines.append(
            f"| {name} | {row['frames_per_s']:.0f} | {row['latency_p50_ms']:.2f} | "
            f"{row['latency_p99_ms']:.2f} | "
            f"{row['latency_p50_ms'] - floor['latency_p50_ms']:+.2f} | "
            f"{row['latency_p99_ms'] - floor['latency_p99_ms']:+.2f} | {growth} |"
        )
    return lines


def table(results: dict[str, dict[str, object]], decisions: dict[str, object]) -> str:
    names = list(results)
    lines = [
        f"Measured {time.strftime('%Y-%m-%d')} on this machine ({os.cpu_count()} cores): the "
        f"proxy under test pinned to CPU {PROXY_CPU}, wrk and the upstream to CPU {LOAD_CPU}; "
        f"the median of {ROUNDS} interleaved rounds of {DURATION} s. Ratios are against the "
        "bare pass-through on asyncio's loop and against nginx (Debian's, one worker, "
        "keepalive to the upstream, nothing buffered), measured in the same run.",
        "",
        "| path | conns | req/s | vs bare | vs nginx | p50 ms | p99 ms |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for conns in CONNECTIONS:
        floor = results[FLOOR][f"c{conns}"]["rps"]  # type: ignore[index]
        ceiling = results.get(CEILING, {}).get(f"c{conns}", {"rps": 0.0})["rps"]  # type: ignore[index,union-attr]
        for name in names:
            row = results[name][f"c{conns}"]  # type: ignore[index]
            lines.append(
                f"| {name} | {conns} | {row['rps']:.0f} | {ratio(row['rps'], floor)} | "
                f"{ratio(row['rps'], ceiling)} | {row['p50_ms']:.2f} | {row['p99_ms']:.2f} |"
            )
    lines += [
        "",
        "64 concurrent NDJSON streams, 100 chunks each, one chunk every 20 ms per stream:",
        "",
        "| path | chunks/s | vs bare | vs nginx | chunk latency p50 ms | chunk latency p99 ms "
        "| p99 vs bare | p99 vs nginx | TTFB p99 ms |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    floor_s = results[FLOOR]["streams"]  # type: ignore[index]
    ceiling_s = results.get(CEILING, {}).get("streams", {})  # type: ignore[union-attr]
    for name in names:
        row = results[name]["streams"]  # type: ignore[index]
        lines.append(
            f"| {name} | {row['chunks_per_s']:.0f} | "
            f"{ratio(row['chunks_per_s'], floor_s['chunks_per_s'])} | "  # type: ignore[index]
            f"{ratio(row['chunks_per_s'], ceiling_s.get('chunks_per_s', 0.0))} | "  # type: ignore[union-attr]
            f"{row['chunk_latency_p50_ms']:.2f} | {row['chunk_latency_p99_ms']:.2f} | "
            f"{ratio(row['chunk_latency_p99_ms'], floor_s['chunk_latency_p99_ms'])} | "  # type: ignore[index]
            f"{ratio(row['chunk_latency_p99_ms'], ceiling_s.get('chunk_latency_p99_ms', 0.0))} | "  # type: ignore[union-attr]
            f"{row['ttfb_p99_ms']:.2f} |"
        )
    lines += ws_table(results)
    lines += ["", "Decision core (in-process, after the proxies stopped):", ""]
    lines += decisions_table(decisions)
    return "\n".join(lines)


def write_doc(text: str) -> None:
    begin, end = "<!-- results:begin -->", "<!-- results:end -->"
    doc = DOC.read_text() if DOC.exists() else f"# Benchmarks\n\n{begin}\n{end}\n"
    if begin not in doc:
        doc += f"\n{begin}\n{end}\n"
    head, rest = doc.split(begin, 1)
    _, tail = rest.split(end, 1)
    DOC.write_text(f"{head}{begin}\n{text}\n{end}{tail}")


def main() -> int:
    nginx = nginx_binary()
    if not WRK.exists() or nginx is None:
        print("bench: wrk or nginx is missing; run `make bench`", file=sys.stderr)
        return 2
    processes: list[subprocess.Popen[bytes]] = []
    os.sched_setaffinity(0, {LOAD_CPU})  # wrk and the stream client inherit this
    with tempfile.TemporaryDirectory(prefix="gpugate-bench-") as tmp:
        try:
            upstream = free_port()
            processes.append(
                start([sys.executable, "-m", "bench.upstream", "--port", str(upstream)], LOAD_CPU)
            )
            targets = {"direct": f"http://127.0.0.1:{upstream}"}
            pids: dict[str, int] = {}
            for name, extra in (
                ("bare pass-through (asyncio)", []),
                ("bare pass-through (uvloop)", ["--uvloop"]),
            ):
                port = free_port()
                processes.append(
                    start(
                        [
                            sys.executable,
                            "-m",
                            "bench.passthrough",
                            "--port",
                            str(port),
                            "--upstream",
                            f"http://127.0.0.1:{upstream}",
                            *extra,
                        ],
                        PROXY_CPU,
                    )
                )
                targets[name] = f"http://127.0.0.1:{port}"
                pids[name] = processes[-1].pid
            port = free_port()
            config = nginx_config(port, upstream, Path(tmp))
            processes.append(start([str(nginx), "-e", "stderr", "-c", str(config)], PROXY_CPU))
            targets[CEILING] = f"http://127.0.0.1:{port}"
            pids[CEILING] = processes[-1].pid
            gpu = SimulatedGpuHost.create(
                Path(tmp) / "gpu", [SimDevice(0, 16 * GiB, 434 * 2**20, "GPU-bench", "bench")]
            )
            shim = library_path()
            for name, loop in (("gpugate (asyncio)", "asyncio"), ("gpugate (uvloop)", "uvloop")):
                port, control = free_port(), free_port()
                config = gate_config(port, control, upstream, Path(tmp) / f"{loop}.yaml")
                env = {
                    **os.environ,
                    STATE_ENV: str(gpu.state_path),
                    "GPUGATE_NVML_LIBRARY": str(shim),
                    "GPUGATE_LOOP": loop,
                    "GPUGATE_LOG_LEVEL": "WARNING",
                }
                processes.append(
                    start(
                        [sys.executable, "-m", "gpugate", "serve", "--config", str(config)],
                        PROXY_CPU,
                        env,
                    )
                )
                wait_http(f"http://127.0.0.1:{control}/gate/v1/health")
                wait_resident(control)
                targets[name] = f"http://127.0.0.1:{port}"
                pids[name] = processes[-1].pid
            for url in targets.values():
                wait_http(url + "/api/ps")
            results: dict[str, dict[str, object]] = {name: {} for name in targets}
            for conns in CONNECTIONS:
                runs: dict[str, list[dict[str, float]]] = {name: [] for name in targets}
                for _ in range(ROUNDS):
                    for name, url in targets.items():
                        runs[name].append(wrk(url, conns))
                for name in targets:
                    results[name][f"c{conns}"] = median_of(runs[name])
                    print(name, conns, results[name][f"c{conns}"], flush=True)
            stream_runs: dict[str, list[dict[str, float]]] = {name: [] for name in targets}
            for _ in range(ROUNDS):
                for name, url in targets.items():
                    stream_runs[name].append(streams(url))
            for name in targets:
                results[name]["streams"] = median_of(stream_runs[name])
                print(name, "streams", results[name]["streams"], flush=True)
            ws_runs: dict[str, list[dict[str, float]]] = {name: [] for name in targets}
            for _ in range(ROUNDS):
                for name, url in targets.items():
                    ws_runs[name].append(ws_bench(url))
            for name, url in targets.items():
                results[name]["ws"] = median_of(ws_runs[name])
                if name in pids:
                    results[name]["ws_slow"] = ws_bench(url, "--slow", "--pid", str(pids[name]))
                print(name, "ws", results[name]["ws"], results[name].get("ws_slow"), flush=True)
        finally:
            for process in processes:
                process.terminate()
            for process in processes:
                process.wait(timeout=30)
    decisions = measure_decisions()
    print("decisions", decisions, flush=True)
    text = table(results, decisions)
    write_doc(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
