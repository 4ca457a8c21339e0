"""What sampling NVML costs the gate as the host grows: calls, time per sample, idle CPU.

    python -m bench.sampling [--samples N] [--idle-seconds S]

Two simulated hosts: one GPU with 10 GPU processes, and 8 GPUs with 500 processes spread
over them. Every process is real (a `sleep` whose command line reads as an Ollama runner,
a Plex transcode or an unclaimed Python job), because the gate attributes each PID from
/proc and the simulated NVML lists a PID only while it lives: fewer, repeated PIDs would
make both cheaper than a host with that many processes.

Per host, measured in this process:

* **NVML calls per sample**: the C functions pynvml calls, counted by wrapping the
  function-pointer lookup pynvml makes before every call (a list of processes is two
  calls: one asks for the count, one fills the array);
* **wall time per sample** (p50 and p99 of BENCH_SAMPLES samples): `Sampler.sample_blocking`,
  the read and attribution the gate's worker thread does each interval, and of that the
  time spent inside the simulated NVML library and in attribution;
* **idle CPU**: a `gpugate serve` at its default sampling interval in front of a
  resident model that nobody asks for, its CPU (user + system, from /proc) over
  BENCH_IDLE_SECONDS, as a percentage of one core.

The simulated library parses its state file again on every call and reads
/proc/PID/stat for every process it counts, work a driver does not do. It adds up the
thread CPU time its calls take (in the file named by $GPUGATE_FAKE_NVML_CPU_FILE), so the
table gives the library's share inside the serving gate, and what the gate itself spends
apart from it.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import attrs
import pynvml

from bench.docfile import write_section
from bench.targets import LOAD_CPU, PROXY_CPU, free_port, start, wait_http
from gpugate.core.units import GiB
from gpugate.gpu.sampler import Sampler
from gpugate.runtimes.sections import load_config_text
from gpugate.sim.device import SimDevice, SimProcess, SimulatedGpuHost
from gpugate.sim.shim import STATE_ENV, library_path

SHAPES = ((1, 10), (8, 500))
"""(GPUs, GPU processes) of the hosts measured."""
SAMPLES = int(os.environ.get("BENCH_SAMPLES", "300"))
IDLE_SECONDS = float(os.environ.get("BENCH_IDLE_SECONDS", "20"))
SETTLE_SECONDS = 3.0
"""Before the idle CPU is read: the gate's first samples attribute every PID afresh."""
TARGET_PERCENT = 1.0
CARD = 80 * GiB
PER_PROCESS = GiB
# Whose processes these are: argv[0] carries the whole command line a real one would
# show; the one argument left is the sleep's duration.
IDENTITIES = (
    "/usr/bin/ollama runner --model /root/.ollama/models/blobs/sha256-{n:064x} --port {port}",
    "/usr/bin/ollama runner --model /root/.ollama/models/blobs/sha256-{n:064x} --port {port}",
    "/usr/bin/ollama runner --model /root/.ollama/models/blobs/sha256-{n:064x} --port {port}",
    "/usr/lib/plexmediaserver/Plex Transcoder -codec:0 hevc -segment {n}",
    "python3 train.py --shard {n}",
)


@attrs.frozen
class SamplingCost:
    """One host's figures (times in milliseconds, CPU in per cent of one core)."""

    gpus: int
    processes: int
    samples: int
    nvml_calls: float
    """C-level NVML calls per sample."""
    calls_by_function: dict[str, float]
    proc_reads: float
    """Files attribution read from /proc per sample, once every PID is known."""
    sample_p50_ms: float
    sample_p99_ms: float
    library_ms: float
    """Median time per sample inside the simulated NVML library."""
    attribution_ms: float
    """Median time per sample attributing PIDs."""
    interval_s: float
    idle_cpu_percent: float
    loop_cpu_percent: float
    """Of the idle CPU, the event loop's thread (the rest: NVML reads and attribution in the
    worker thread, the store's thread)."""
    library_percent: float
    """Of the idle CPU, what the simulated library's calls took inside the serving gate (the
    library adds up its own thread CPU time: $GPUGATE_FAKE_NVML_CPU_FILE)."""
    idle_seconds: float

    @property
    def own_percent(self) -> float:
        """The idle CPU less the simulated library's share: what the gate spends itself."""
        return self.idle_cpu_percent - self.library_percent


def spawn_processes(count: int) -> list[subprocess.Popen[bytes]]:
    """`count` sleeping processes whose command lines read as GPU workloads'."""
    lifetime = str(int(IDLE_SECONDS + SAMPLES + 600))
    sleeper = "/bin/sleep" if os.path.exists("/bin/sleep") else "/usr/bin/sleep"
    children = []
    for n in range(count):
        name = IDENTITIES[n % len(IDENTITIES)].format(n=n, port=40000 + n)
        children.append(
            subprocess.Popen(
                [name, lifetime], executable=sleeper, stdin=subprocess.DEVNULL, close_fds=True
            )
        )
    return children


def stop_processes(children: list[subprocess.Popen[bytes]]) -> None:
    for child in children:
        child.terminate()
    for child in children:
        child.wait()


def write_host(directory: Path, gpus: int, pids: list[int]) -> SimulatedGpuHost:
    """`gpus` cards of 80 GiB, the PIDs dealt over them in turn, 1 GiB each."""
    devices = [
        SimDevice(i, CARD, 500 * 2**20, f"GPU-bench-{i:02d}", "NVIDIA A100 80GB")
        for i in range(gpus)
    ]
    host = SimulatedGpuHost.create(directory, devices)
    state = host.read()
    state.processes = [
        SimProcess(n % gpus, pid, PER_PROCESS, "C", "ollama" if n % 5 < 3 else "worker")
        for n, pid in enumerate(pids)
    ]
    # Written once, as SimulatedGpuHost writes it (atomically), not 500 locked edits.
    tmp = host.state_path.with_suffix(".tmp")
    tmp.write_text(state.render())
    os.replace(tmp, host.state_path)
    return host


def config_text(listen: int, control: int, upstream: int, library: Path) -> str:
    """One Ollama consumer that claims the runners, Plex as an external service, the
    sampling interval left at its default."""
    return f"""\
gate:
  control: 127.0.0.1:{control}
  shutdown_grace: 1s
  nvml_library: {library}
consumers:
  ollama:
    runtime: ollama
    listen: 127.0.0.1:{listen}
    upstream: http://127.0.0.1:{upstream}
    processes: {{commands: ["ollama runner"]}}
    models:
      bench: {{envelope: 1GiB}}
external:
  plex:
    processes: {{commands: ["Plex Transcoder"]}}
"""


class CallCounter:
    """Counts and times every C function pynvml calls, by name."""

    def __init__(self) -> None:
        self.calls: Counter[str] = Counter()
        self.seconds = 0.0
        self._lookup = pynvml._nvmlGetFunctionPointer

    def __enter__(self) -> CallCounter:
        lookup = self._lookup

        def counted(name: str):  # type: ignore[no-untyped-def]
            fn = lookup(name)
            if name == "nvmlErrorString":  # pynvml sets its restype on the pointer
                return fn

            def call(*args):  # type: ignore[no-untyped-def]
                self.calls[name] += 1
                began = time.perf_counter()
                try:
                    return fn(*args)
                finally:
                    self.seconds += time.perf_counter() - began

            return call

        pynvml._nvmlGetFunctionPointer = counted
        return self

    def __exit__(self, *exc: object) -> None:
        pynvml._nvmlGetFunctionPointer = self._lookup


def measure_in_process(host: SimulatedGpuHost, samples: int) -> dict[str, object]:
    """Calls, /proc reads and time of `samples` samples, each as the worker thread takes it."""
    os.environ[STATE_ENV] = str(host.state_path)
    config = load_config_text(
        config_text(1, 2, 3, library_path()), host.directory / "consumers.yaml"
    )
    sampler = Sampler.from_config(config)
    attributor = sampler.attributor
    attributing: list[float] = []

    class Timed:
        def attribute(self, pids):  # type: ignore[no-untyped-def]
            began = time.perf_counter()
            try:
                return attributor.attribute(pids)
            finally:
                attributing.append(time.perf_counter() - began)

    sampler.attributor = Timed()
    try:
        # The first samples open NVML and read every PID's files; what is measured is the
        # steady state that follows.
        for _ in range(3):
            assert sampler.sample_blocking().error is None
        attributing.clear()
        reads_before = attributor.reads  # type: ignore[attr-defined]
        walls: list[float] = []
        inside: list[float] = []
        with CallCounter() as counter:
            for _ in range(samples):
                before = counter.seconds
                began = time.perf_counter()
                observation = sampler.sample_blocking()
                walls.append(time.perf_counter() - began)
                inside.append(counter.seconds - before)
                assert observation.error is None, observation.error
        listed = sum(len(d.processes) for d in observation.devices)
        assert listed == len(host.read().processes), (listed, "processes listed")
    finally:
        sampler.close()
    walls.sort()
    return {
        "nvml_calls": sum(counter.calls.values()) / samples,
        "calls_by_function": {k: v / samples for k, v in sorted(counter.calls.items())},
        "proc_reads": (attributor.reads - reads_before) / samples,  # type: ignore[attr-defined]
        "sample_p50_ms": statistics.median(walls) * 1000,
        "sample_p99_ms": walls[min(len(walls) - 1, int(0.99 * len(walls)))] * 1000,
        "library_ms": statistics.median(inside) * 1000,
        "attribution_ms": statistics.median(attributing) * 1000,
    }


def cpu_ticks(stat: Path) -> int:
    """User + system ticks from a stat file: a process's (every thread's, the ended ones'
    too) or one thread's (/proc/PID/task/TID/stat)."""
    fields = stat.read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])


def library_ns(counter: Path) -> int:
    """The simulated library's own CPU time so far, in the process that maps `counter`."""
    data = counter.read_bytes()
    return int.from_bytes(data[:8], sys.byteorder) if len(data) >= 8 else 0


def idle_cpu(host: SimulatedGpuHost, seconds: float) -> tuple[float, float, float, float]:
    """A gate serving nothing on this host: % of one core in all, in its event loop's thread
    (the main one) and inside the simulated library's calls, and its sampling interval."""
    listen, control, upstream = free_port(), free_port(), free_port()
    config = host.directory / "gate.yaml"
    config.write_text(config_text(listen, control, upstream, library_path()))
    counter = host.directory / "nvml-cpu"
    env = {
        **os.environ,
        STATE_ENV: str(host.state_path),
        "GPUGATE_LOG_LEVEL": "WARNING",
        "GPUGATE_FAKE_NVML_CPU_FILE": str(counter),
    }
    upstream_process = start(
        [sys.executable, "-m", "bench.upstream", "--port", str(upstream)], LOAD_CPU
    )
    gate = start(
        [sys.executable, "-m", "gpugate", "serve", "--config", str(config)],
        PROXY_CPU,
        env,
        host.directory / "gate.log",
    )
    try:
        wait_http(f"http://127.0.0.1:{control}/gate/v1/health")
        time.sleep(SETTLE_SECONDS)
        tick = os.sysconf("SC_CLK_TCK")
        process = Path(f"/proc/{gate.pid}/stat")
        main = Path(f"/proc/{gate.pid}/task/{gate.pid}/stat")
        before, loop_before, began = cpu_ticks(process), cpu_ticks(main), time.monotonic()
        inside_before = library_ns(counter)
        time.sleep(seconds)
        spent, loop = cpu_ticks(process) - before, cpu_ticks(main) - loop_before
        inside = library_ns(counter) - inside_before
        elapsed = time.monotonic() - began
        interval = load_config_text(config.read_text(), config).budget.sample_interval
        return (
            spent / tick / elapsed * 100,
            loop / tick / elapsed * 100,
            inside / 1e9 / elapsed * 100,
            interval,
        )
    finally:
        for process in (gate, upstream_process):
            process.terminate()
            process.wait(timeout=30)


def measure_shape(gpus: int, processes: int, samples: int, idle_seconds: float) -> SamplingCost:
    """Every figure of one host shape, its processes started and stopped here."""
    children = spawn_processes(processes)
    try:
        with tempfile.TemporaryDirectory(prefix="gpugate-sampling-") as tmp:
            host = write_host(Path(tmp) / "gpu", gpus, [c.pid for c in children])
            figures = measure_in_process(host, samples)
            percent, loop, library, interval = idle_cpu(host, idle_seconds)
    finally:
        stop_processes(children)
    return SamplingCost(
        gpus=gpus,
        processes=processes,
        samples=samples,
        interval_s=interval,
        idle_cpu_percent=percent,
        loop_cpu_percent=loop,
        library_percent=library,
        idle_seconds=idle_seconds,
        **figures,  # type: ignore[arg-type]
    )


def measure(samples: int = SAMPLES, idle_seconds: float = IDLE_SECONDS) -> list[SamplingCost]:
    """Every shape of SHAPES, smallest first."""
    return [measure_shape(g, p, samples, idle_seconds) for g, p in SHAPES]


def measure_apart(samples: int = SAMPLES, idle_seconds: float = IDLE_SECONDS) -> list[SamplingCost]:
    """`measure` in a new Python process: NVML is opened once per process, and this one
    should not carry the heap of the benchmarks before it."""
    done = subprocess.run(
        [sys.executable, "-m", "bench.sampling", "--samples", str(samples),
         "--idle-seconds", str(idle_seconds)],
        capture_output=True,
        text=True,
        check=True,
    )  # fmt: skip
    return [SamplingCost(**row) for row in json.loads(done.stdout.splitlines()[0])]


def table(results: list[SamplingCost]) -> list[str]:
    """The section's lines for docs/benchmarks.md."""
    first = results[0]
    lines = [
        "",
        f"Measured {time.strftime('%Y-%m-%d')}. "
        f"Sampling NVML as the host grows (simulated cards; every GPU process a real process "
        f"the gate attributes from /proc). Calls: the C functions of NVML called per sample; "
        f"time: one sample as the gate's worker thread takes it (read and attribution), p50 "
        f"and p99 of {first.samples} samples, and of its median what was spent inside the "
        f"simulated NVML library and in attribution; idle CPU: `gpugate serve` at its "
        f"default interval ({first.interval_s:g} s), serving nothing, over "
        f"{first.idle_seconds:g} s, in per cent of one core: in all, in its event loop's "
        f"thread, the simulated library's share (the CPU its calls took inside the serving "
        f"gate, as the library counts it) and "
        f"what is left without it, which is held to the target (below "
        f"{TARGET_PERCENT:g} % of a core):",
        "",
        "| GPUs × processes | NVML calls/sample | /proc reads/sample | ms/sample p50 / p99 "
        "| in the library ms | attribution ms | idle CPU % | event loop % | the library % "
        "| without the library % | met |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in results:
        met = "met" if r.own_percent < TARGET_PERCENT else "missed"
        lines.append(
            f"| {r.gpus} × {r.processes} | {r.nvml_calls:.0f} | {r.proc_reads:.0f} | "
            f"{r.sample_p50_ms:.2f} / {r.sample_p99_ms:.2f} | {r.library_ms:.2f} | "
            f"{r.attribution_ms:.2f} | {r.idle_cpu_percent:.2f} | {r.loop_cpu_percent:.2f} | "
            f"{r.library_percent:.2f} | {r.own_percent:.2f} | {met} |"
        )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=SAMPLES)
    parser.add_argument("--idle-seconds", type=float, default=IDLE_SECONDS)
    parser.add_argument("--write", action="store_true", help="update docs/benchmarks.md")
    args = parser.parse_args()
    results = measure(args.samples, args.idle_seconds)
    print(json.dumps([attrs.asdict(r) for r in results]))
    print("\n".join(table(results)))
    if args.write:
        write_section("sampling", "\n".join(table(results)))


if __name__ == "__main__":
    main()
