"""A seeded random trace on the incident host: `python -m tests.faults.trace --requests N --seed S`.

One trace, replayed twice on a fresh incident host (tests/e2e/test_incident_whisper.py:
the incident card, whisper-server as a systemd unit under a fake `systemctl`):

* **direct**: every client at its runtime's own port; whisper-server's unit without the
  gpugate drop-in (no `gpugate admit`); leased work allocating without a lease;
* **gated**: the same clients at the gate's ports; the unit's ExecStartPre is
  `gpugate admit whisper`; leased work under `POST /gate/v1/leases` with the token.

The trace mixes Ollama requests (every class by X-GPUGate-Priority, streaming or not,
clients that leave mid-stream, keep_alive values), whisper transcriptions and restarts of
its unit, explicit leases whose holder then allocates the bytes, ComfyUI prompts and Plex
transcodes growing and shrinking (an external process, through the host's state).
Gated, ComfyUI's prompts go through the gate too (job leases sized from their files).

Counted: out-of-memory events on the simulated card (whisper aborts included) by who hit
them; at the end of the gated run nothing may be left leased. Exits 1 when the gated run
has an OOM of an admitted runtime or a lease left over.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import aiohttp
import attrs
import yaml

from gpugate.core.units import GiB, MiB
from gpugate.sim.device import GpuOutOfMemory, SimulatedGpuHost
from gpugate.sim.hostprocess import SimulatedHostProcess
from gpugate.sim.whisper.process import child_env
from tests.e2e.test_incident_whisper import (
    TOKEN,
    UNIT,
    consumers,
    incident_host,
    systemd_dir,
    wav,
)
from tests.gate.harness import free_ports
from tests.sim.comfyui_helpers import SD15, txt2img
from tests.sim.processes import LineReader

CONCURRENCY = 8
CLASSES = ("production", "interactive", "background", "benchmark", "maintenance")
MODELS = {"gemma3:12b": 11600, "bge-m3": 2012, "llama3.2:3b": 3200, "qwen2.5:7b": 5700}
PLEX = ["/usr/lib/plexmediaserver/Plex Transcoder", "-codec:0", "hevc"]
OPS = (("ollama", 55), ("transcribe", 14), ("restart", 4), ("lease", 8), ("comfy", 6),
       ("plex", 13))  # fmt: skip


@attrs.define
class Run:
    gated: bool
    rng: random.Random
    gpu: SimulatedGpuHost
    env: dict[str, str]
    urls: dict[str, str]
    outcomes: Counter[str] = attrs.field(factory=Counter)
    plex_pid: int = 0
    plex_extra: int = 0
    restart_lock: asyncio.Lock = attrs.field(factory=asyncio.Lock)

    async def op(self, session: aiohttp.ClientSession, kind: str, seed: int) -> None:
        rng = random.Random(seed)
        try:
            await getattr(self, kind)(session, rng)
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            self.outcomes[f"{kind}: {type(exc).__name__}"] += 1

    async def ollama(self, session: aiohttp.ClientSession, rng: random.Random) -> None:
        model = rng.choice(list(MODELS))
        headers = {"X-GPUGate-Priority": rng.choice(CLASSES)} if rng.random() < 0.5 else {}
        stream = rng.random() < 0.5
        leave = stream and rng.random() < 0.15
        if model == "bge-m3":
            path, body = "/api/embed", {"model": model, "input": ["a", "b"]}
        else:
            body = {"model": model, "prompt": "q", "stream": stream,
                    "options": {"num_predict": rng.randint(1, 8)}}  # fmt: skip
            if rng.random() < 0.3:
                body["keep_alive"] = rng.choice(["5m", "30s", 0, "24h"])
            path = "/api/generate"
        async with session.post(self.urls["ollama"] + path, json=body, headers=headers) as r:
            if leave:
                await r.content.readany()
                r.close()
                self.outcomes["ollama: left mid-stream"] += 1
                return
            await r.read()
            self.outcomes[f"ollama: {r.status} {r.headers.get('X-GPUGate-Failure', '')}"] += 1

    async def transcribe(self, session: aiohttp.ClientSession, rng: random.Random) -> None:
        form = aiohttp.FormData()
        form.add_field("file", wav(rng.uniform(0.5, 3)), filename="a.wav", content_type="audio/wav")
        async with session.post(self.urls["whisper"] + "/inference", data=form) as r:
            await r.read()
            self.outcomes[f"transcribe: {r.status} {r.headers.get('X-GPUGate-Failure', '')}"] += 1

    async def restart(self, session: aiohttp.ClientSession, rng: random.Random) -> None:
        async with self.restart_lock:  # systemd runs one job per unit at a time
            await self.systemctl("stop")
            code = await self.systemctl("start")
        self.outcomes[f"restart: {'started' if code == 0 else 'start refused'}"] += 1

    async def lease(self, session: aiohttp.ClientSession, rng: random.Random) -> None:
        nbytes = rng.choice([1, 2, 3]) * GiB
        hold = rng.uniform(0.2, 1.5)
        lease = None
        if self.gated:
            ask = {"consumer": "ollama", "bytes": nbytes, "class": rng.choice(CLASSES[:3]),
                   "ttl": 30, "max_wait": 20}  # fmt: skip
            headers = {"Authorization": f"Bearer {TOKEN}"}
            async with session.post(self.urls["control"] + "/gate/v1/leases", json=ask,
                                    headers=headers) as r:  # fmt: skip
                if r.status != 201:
                    self.outcomes[f"lease: {r.status} {r.headers.get('X-GPUGate-Failure')}"] += 1
                    return
                lease = (await r.json())["id"]
        try:
            # The leased work allocates its bytes (a batch job on the GPU), then frees them.
            await asyncio.to_thread(self.gpu.allocate, os.getpid(), nbytes)
        except GpuOutOfMemory:
            self.outcomes["lease: work hit OOM"] += 1
        else:
            await asyncio.sleep(hold)
            await asyncio.to_thread(self.gpu.release, os.getpid(), nbytes)
            self.outcomes["lease: work done"] += 1
        finally:
            if lease is not None:
                headers = {"Authorization": f"Bearer {TOKEN}"}
                url = f"{self.urls['control']}/gate/v1/leases/{lease}"
                async with session.delete(url, headers=headers) as r:
                    await r.read()

    async def comfy(self, session: aiohttp.ClientSession, rng: random.Random) -> None:
        body = {"prompt": txt2img(seed=rng.randint(1, 10**6), steps=2), "client_id": "trace"}
        async with session.post(self.urls["comfyui"] + "/prompt", json=body) as r:
            await r.read()
            self.outcomes[f"comfy: {r.status}"] += 1

    async def plex(self, session: aiohttp.ClientSession, rng: random.Random) -> None:
        """A transcode starts or ends: Plex grows or shrinks by up to 1 GiB (only growth
        that fits: the gate cannot stop an external process, it keeps a reserve)."""
        target = rng.choice([0, 0, 512 * MiB, GiB])
        if target > self.plex_extra and self.gpu.free() - (target - self.plex_extra) > 256 * MiB:
            with contextlib.suppress(GpuOutOfMemory):
                self.gpu.allocate(self.plex_pid, target - self.plex_extra)
                self.plex_extra = target
        elif target < self.plex_extra:
            self.gpu.release(self.plex_pid, self.plex_extra - target)
            self.plex_extra = target
        self.outcomes["plex: pulse"] += 1

    async def systemctl(self, verb: str) -> int:
        done = await asyncio.to_thread(
            subprocess.run, ["systemctl", verb, UNIT], env=self.env, capture_output=True
        )
        return done.returncode


def trace_ops(requests: int, seed: int) -> list[tuple[str, int]]:
    """The trace: each operation's kind and its own seed (the same in both runs)."""
    rng = random.Random(seed)
    kinds = [k for k, _ in OPS]
    weights = [w for _, w in OPS]
    return [(rng.choices(kinds, weights)[0], rng.randrange(2**32)) for _ in range(requests)]


def setup(tmp: Path, *, gated: bool) -> tuple[dict, dict[str, int], Path, Path]:
    names = ("ollama", "comfyui", "whisper", "mvoice", "listen", "comfyui_listen",
             "whisper_listen", "mvoice_listen", "control")  # fmt: skip
    ports = dict(zip(names, free_ports(len(names)), strict=True))
    host, spec = incident_host(ports)
    for model in host["ollama"]["models"]:
        model["load_seconds"] = "200ms"
    host["ollama"]["tokens_per_second"] = 400
    host["holders"].append({"name": "Plex Transcoder", "command": PLEX, "bytes": "256MiB"})
    (tmp / "host.yaml").write_text(yaml.safe_dump(host))
    config = yaml.safe_load(consumers(ports))
    models = config["consumers"]["ollama"]["models"]
    for name, mib in MODELS.items():
        models.setdefault(name, {})["envelope"] = f"{mib}MiB"
    # Its prompts' checkpoint by size, as an operator writes it: unsized, a file counts 8 GiB.
    config["consumers"]["comfyui"]["comfyui"] = {"files": {SD15: "2034MiB"}}
    config["external"] = {"plex": {"processes": {"commands": ["Plex Transcoder"]}}}
    config["classes"] = {c: {"max_wait": "20s"} for c in CLASSES}
    (tmp / "consumers.yaml").write_text(yaml.safe_dump(config))
    systemd_dir(tmp, spec, tmp / "state", tmp / "consumers.yaml")
    if not gated:  # the unit as it was before the gpugate drop-in
        unit = tmp / "systemd" / f"{UNIT}.json"
        unit.write_text(json.dumps({"exec": json.loads(unit.read_text())["exec"]}))
    return host, ports, tmp / "host.yaml", tmp / "consumers.yaml"


async def replay(ops: list[tuple[str, int]], *, gated: bool, seed: int) -> dict[str, object]:
    """One run of the trace on a fresh host; its figures."""
    with tempfile.TemporaryDirectory(prefix="gpugate-trace-") as name:
        tmp = Path(name)
        _, ports, host_file, config = setup(tmp, gated=gated)
        with SimulatedHostProcess(host_file, tmp / "state") as sim:
            assert sim.environment is not None
            env = child_env({
                **sim.environment.apply(),
                "GPUGATE_CONTROL_TOKEN": TOKEN,
                "FAKE_SYSTEMD_DIR": str(tmp / "systemd"),
                "PATH": f"{tmp / 'bin'}{os.pathsep}{os.environ['PATH']}",
            })  # fmt: skip
            env.pop("GPUGATE_TOKEN", None)
            gpu = SimulatedGpuHost(tmp / "state")
            plex = next(p.pid for p in gpu.read().processes if p.name.startswith("Plex"))
            local = "http://127.0.0.1:"
            urls = {
                "control": f"{local}{ports['control']}",
                "comfyui": f"{local}{ports['comfyui']}",
            }
            gate = None
            if gated:
                urls |= {"ollama": f"{local}{ports['listen']}",
                         "whisper": f"{local}{ports['whisper_listen']}",
                         "comfyui": f"{local}{ports['comfyui_listen']}"}  # fmt: skip
                gate = subprocess.Popen(
                    [sys.executable, "-m", "gpugate", "serve", "--config", str(config)],
                    env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                )  # fmt: skip
                LineReader(gate.stderr)
                LineReader(gate.stdout).until("gpugate: ready", timeout=30)
            else:
                urls |= {"ollama": f"{local}{ports['ollama']}",
                         "whisper": f"{local}{ports['whisper']}"}  # fmt: skip
            run = Run(gated, random.Random(seed), gpu, env, urls, plex_pid=plex)
            try:
                await run.systemctl("start")
                started = time.monotonic()
                pending = iter(ops)
                timeout = aiohttp.ClientTimeout(total=90)
                async with aiohttp.ClientSession(timeout=timeout) as session:

                    async def worker() -> None:
                        for kind, op_seed in pending:
                            await run.op(session, kind, op_seed)

                    await asyncio.gather(*(worker() for _ in range(CONCURRENCY)))
                    left = await leases_left(urls["control"]) if gated else []
                elapsed = time.monotonic() - started
                ooms = Counter(o.name for o in gpu.ooms())
            finally:
                await run.systemctl("stop")
                if gate is not None:
                    gate.send_signal(signal.SIGTERM)
                    gate.wait(timeout=30)
    return {"ooms": ooms, "outcomes": run.outcomes, "left": left, "seconds": elapsed}


async def leases_left(control: str, settle: float = 15.0) -> list[dict]:
    """The gate's leases once the trace is over (a start lease ends when NVML shows it)."""
    deadline = time.monotonic() + settle
    async with aiohttp.ClientSession() as session:
        while True:
            async with session.get(control + "/gate/v1/status") as r:
                leases = (await r.json())["leases"]
            if not leases or time.monotonic() > deadline:
                return leases
            await asyncio.sleep(0.2)


def admitted_ooms(ooms: Counter[str]) -> int:
    """OOMs of what the gate admits: every runtime's (Plex's growth is counted apart)."""
    return sum(n for name, n in ooms.items() if not name.startswith("Plex"))


def comfyui_ooms(ooms: Counter[str]) -> int:
    return sum(n for name, n in ooms.items() if "ComfyUI" in name or "main.py" in name)


def table(requests: int, seed: int, direct: dict, gated: dict) -> str:
    """The figures of both runs side by side."""
    comfy = [comfyui_ooms(r["ooms"]) for r in (direct, gated)]
    rows = [
        f"trace: {requests} operations, seed {seed}",
        f"{'':28} {'direct':>10} {'gated':>10}",
        f"{'OOMs of admitted runtimes':28} {admitted_ooms(direct['ooms']):>10} "
        f"{admitted_ooms(gated['ooms']):>10}",
        f"{'  of which whisper aborts':28} {direct['ooms'].get('whisper-server', 0):>10} "
        f"{gated['ooms'].get('whisper-server', 0):>10}",
        f"{'  of which ComfyUI prompts':28} {comfy[0]:>10} {comfy[1]:>10}",
        f"{'leases left at the end':28} {'-':>10} {len(gated['left']):>10}",
        f"{'seconds':28} {direct['seconds']:>10.1f} {gated['seconds']:>10.1f}",
    ]  # fmt: skip
    for label, run in (("direct", direct), ("gated", gated)):
        rows.append(
            f"{label} outcomes: "
            + ", ".join(f"{k} {v}" for k, v in sorted(run["outcomes"].items()))
        )
        rows.append(f"{label} OOMs by process: {dict(run['ooms'])}")
    return "\n".join(rows)


async def main_async(requests: int, seed: int) -> int:
    ops = trace_ops(requests, seed)
    direct = await replay(ops, gated=False, seed=seed)
    gated = await replay(ops, gated=True, seed=seed)
    print(table(requests, seed, direct, gated), flush=True)
    ok = admitted_ooms(gated["ooms"]) == 0 and not gated["left"]
    return 0 if ok else 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=20260729)
    args = parser.parse_args()
    return asyncio.run(main_async(args.requests, args.seed))


if __name__ == "__main__":
    sys.exit(main())
