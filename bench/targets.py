"""The benchmark's targets: the upstream, and every proxy in front of it, started and stopped
together.

The proxy under test gets a core of its own; the load generator and the upstream share the
other (on a machine with one core, all share it).
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import attrs

from gpugate.core.units import GiB
from gpugate_sim.device import SimDevice, SimulatedGpuHost
from gpugate_sim.shim import STATE_ENV, library_path

ROOT = Path(__file__).resolve().parents[1]
NGINX = ROOT / "build" / "nginx" / "usr" / "sbin" / "nginx"
WRK = ROOT / "build" / "wrk" / "usr" / "bin" / "wrk"
WRK_LIB = ROOT / "build" / "wrk" / "usr" / "lib" / "x86_64-linux-gnu"
CPUS = sorted(os.sched_getaffinity(0))
LOAD_CPU = CPUS[0]
PROXY_CPU = CPUS[-1]
DIRECT = "direct"
FLOOR = "bare pass-through (asyncio)"
CEILING = "nginx"
PROXIES = (
    FLOOR,
    "bare pass-through (uvloop)",
    CEILING,
    "gpugate (asyncio)",
    "gpugate (uvloop)",
)
LLHTTP_FLOOR = "bare pass-through, llhttp client (asyncio)"
"""The bare pass-through forwarding through the gate's own client (bench/passthrough.py):
measured for the request rate only, to show what that client is worth on its own."""
IDLE_CONNECTIONS = int(os.environ.get("BENCH_IDLE_CONNS", "10000"))
"""Keep-alive client connections held open at once by the idle-connections measurement."""
CONNECTION_ROOM = IDLE_CONNECTIONS + 1024
"""What each proxy is configured to accept: the idle connections and some to spare."""


def raise_fd_limit() -> int:
    """The soft RLIMIT_NOFILE raised to the hard one (10,000 connections need 10,000 fds)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        return hard
    return soft


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


def start(
    argv: list[str], cpu: int, env: dict[str, str] | None = None, log: Path | None = None
) -> subprocess.Popen[bytes]:
    """A process pinned to `cpu`, its open-files limit raised; its stderr to `log` if given."""

    def pin() -> None:
        os.sched_setaffinity(0, {cpu})
        raise_fd_limit()

    with open(log or os.devnull, "wb") as stderr:
        return subprocess.Popen(
            argv, env=env, stdout=subprocess.DEVNULL, stderr=stderr, preexec_fn=pin
        )


def gate_config(port: int, control: int, upstream: int, path: Path) -> Path:
    """One Ollama consumer; its connection cap and idle timeout fit the idle-connections run.

    The gate lowers `max_connections` itself if the open-files limit cannot carry it.
    """
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
    limits: {{max_connections: {CONNECTION_ROOM}, idle_timeout: 600s}}
    models:
      bench: {{envelope: 1GiB}}
""")
    return path


def bench_gpu(directory: Path) -> SimulatedGpuHost:
    """The simulated card a benchmarked gate samples: 16 GiB, nothing else on it."""
    return SimulatedGpuHost.create(
        directory, [SimDevice(0, 16 * GiB, 434 * 2**20, "GPU-bench", "bench")]
    )


def gate_env(gpu: SimulatedGpuHost, **extra: str) -> dict[str, str]:
    """A benchmarked gate's environment: `gpu` through the fake NVML, warnings only."""
    return {
        **os.environ,
        STATE_ENV: str(gpu.state_path),
        "GPUGATE_NVML_LIBRARY": str(library_path()),
        "GPUGATE_LOG_LEVEL": "WARNING",
        **extra,
    }


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
    # worker_connections counts the upstream side too.
    path.write_text(f"""\
daemon off;
master_process off;
worker_processes 1;
pid {home / "nginx.pid"};
error_log {home / "error.log"} warn;
events {{ worker_connections {CONNECTION_ROOM + 1024}; }}
http {{
  access_log off;
  keepalive_timeout 600s;
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


def wait_resident(control: int) -> None:
    """The gate lists the upstream's model as resident, so requests lease 0 bytes."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        with urllib.request.urlopen(f"http://127.0.0.1:{control}/gate/v1/status") as resp:
            if json.load(resp)["residents"]:
                return
        time.sleep(0.1)
    raise RuntimeError("the gate never saw the benchmark model as resident")


@attrs.frozen
class Target:
    """Where a path is reached, and the process whose memory is its cost."""

    url: str
    pid: int
    proxy: bool


@attrs.define
class Rig:
    """The upstream and the chosen proxies in front of it; `stop` ends every process."""

    tmp: Path
    targets: dict[str, Target] = attrs.field(factory=dict)
    processes: list[subprocess.Popen[bytes]] = attrs.field(factory=list)
    logs: dict[str, Path] = attrs.field(factory=dict)
    """Each gate's stderr (warnings and up), kept for the report of a failed run."""

    def start(self, names: tuple[str, ...] = (DIRECT, *PROXIES)) -> None:
        """Start the upstream and the proxies named, in that order; wait until each answers."""
        home = Path(tempfile.mkdtemp(dir=self.tmp))
        upstream = free_port()
        self.processes.append(
            start([sys.executable, "-m", "bench.upstream", "--port", str(upstream)], LOAD_CPU)
        )
        if DIRECT in names:
            self.targets[DIRECT] = Target(
                f"http://127.0.0.1:{upstream}", self.processes[-1].pid, proxy=False
            )
        gpu = None
        for name in names:
            if name == DIRECT:
                continue
            port = free_port()
            if name.startswith("bare pass-through"):
                argv = [sys.executable, "-m", "bench.passthrough", "--port", str(port)]
                argv += ["--upstream", f"http://127.0.0.1:{upstream}"]
                argv += ["--uvloop"] * ("uvloop" in name) + ["--llhttp"] * ("llhttp" in name)
                self.processes.append(start(argv, PROXY_CPU))
            elif name == CEILING:
                nginx = nginx_binary()
                if nginx is None:
                    raise RuntimeError("nginx is missing; run `make bench`")
                config = nginx_config(port, upstream, home)
                self.processes.append(
                    start([str(nginx), "-e", "stderr", "-c", str(config)], PROXY_CPU)
                )
            elif name.startswith("gpugate"):
                if gpu is None:
                    gpu = bench_gpu(home / "gpu")
                loop = "uvloop" if "uvloop" in name else "asyncio"
                control = free_port()
                config = gate_config(port, control, upstream, home / f"{loop}.yaml")
                env = gate_env(gpu, GPUGATE_LOOP=loop)
                argv = [sys.executable, "-m", "gpugate", "serve", "--config", str(config)]
                self.logs[name] = home / f"{loop}.log"
                self.processes.append(start(argv, PROXY_CPU, env, self.logs[name]))
                wait_http(f"http://127.0.0.1:{control}/gate/v1/health")
                wait_resident(control)
            else:
                raise ValueError(f"no such target: {name}")
            self.targets[name] = Target(
                f"http://127.0.0.1:{port}", self.processes[-1].pid, proxy=True
            )
        for target in self.targets.values():
            wait_http(target.url + "/api/ps")

    def stop(self) -> None:
        for process in self.processes:
            process.terminate()
        for process in self.processes:
            process.wait(timeout=30)
        self.processes.clear()
        self.targets.clear()
