"""A seeded random trace: `python -m tests.faults.trace --requests N --seed S [--host H]`.

One trace, replayed twice on a fresh host (tests/faults/trace_hosts.py: the incident card,
or the same server with a second card; whisper-server as a systemd unit under a fake
`systemctl`):

* **direct**: every client at its runtime's own port; whisper-server's unit without the
  gpugate drop-in (no `gpugate admit`); leased work allocating without a lease;
* **gated**: the same clients at the gate's ports; the unit's ExecStartPre is
  `gpugate admit whisper`; leased work under `POST /gate/v1/leases` with the token.

The trace mixes Ollama requests (every class by X-GPUGate-Priority, streaming or not,
clients that leave mid-stream, keep_alive values), whisper transcriptions and restarts of
its unit, explicit leases whose holder then allocates the bytes, ComfyUI prompts and Plex
transcodes growing and shrinking (an external process, through the host's state).
Gated, ComfyUI's prompts go through the gate too (job leases sized from their files).

Counted: out-of-memory events on the simulated cards (whisper aborts included) by who hit
them and on which card; at the end of the gated run nothing may be left leased. Exits 1
when the gated run has an OOM of an admitted runtime or a lease left over.

Gated, also the gate's `overrun` events per card, and how many of them the books' correction
followed (tests/faults/trace_overruns.py).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
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
from prometheus_client.parser import text_string_to_metric_families

from gpugate.core.units import GiB, MiB
from gpugate_sim.device import GpuOutOfMemory, SimulatedGpuHost
from gpugate_sim.hostprocess import SimulatedHostProcess
from gpugate_sim.serverprocess import child_env
from tests.e2e.test_incident_whisper import TOKEN, UNIT, wav
from tests.faults.trace_hosts import CLASSES, HOSTS, INCIDENT, HostName, TraceHost, setup
from tests.faults.trace_overruns import logged_events, overrun_rows, overruns, overruns_counted
from tests.sim.comfyui_helpers import txt2img
from tests.sim.processes import LineReader

CONCURRENCY = 8
OPS = (("ollama", 55), ("transcribe", 14), ("restart", 4), ("lease", 8), ("comfy", 6),
       ("plex", 13))  # fmt: skip


@attrs.define
class Run:
    gated: bool
    host: TraceHost
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
        model = rng.choice(list(self.host.models))
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
        card = rng.choice(self.host.lease_gpus)
        lease = None
        if self.gated:
            ask = {"consumer": "ollama", "bytes": nbytes, "class": rng.choice(CLASSES[:3]),
                   "ttl": 30, "max_wait": 20, "gpu": card}  # fmt: skip
            headers = {"Authorization": f"Bearer {TOKEN}"}
            async with session.post(self.urls["control"] + "/gate/v1/leases", json=ask,
                                    headers=headers) as r:  # fmt: skip
                if r.status != 201:
                    self.outcomes[f"lease: {r.status} {r.headers.get('X-GPUGate-Failure')}"] += 1
                    return
                lease = (await r.json())["id"]
        try:
            # The leased work allocates its bytes (a batch job on the GPU), then frees them.
            await asyncio.to_thread(self.gpu.allocate, os.getpid(), nbytes, gpu=card)
        except GpuOutOfMemory:
            self.outcomes["lease: work hit OOM"] += 1
        else:
            await asyncio.sleep(hold)
            await asyncio.to_thread(self.gpu.release, os.getpid(), nbytes, gpu=card)
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
            self.outcomes[f"comfy: {r.status} {r.headers.get('X-GPUGate-Failure', '')}"] += 1

    async def plex(self, session: aiohttp.ClientSession, rng: random.Random) -> None:
        """A transcode starts or ends: Plex grows or shrinks by up to 1 GiB (only growth
        that fits: the gate cannot stop an external process, it keeps a reserve)."""
        target = rng.choice([0, 0, 512 * MiB, GiB])
        card = self.host.plex_gpu
        growth = target - self.plex_extra
        if target > self.plex_extra and self.gpu.free(card) - growth > 256 * MiB:
            with contextlib.suppress(GpuOutOfMemory):
                self.gpu.allocate(self.plex_pid, growth, gpu=card)
                self.plex_extra = target
        elif target < self.plex_extra:
            self.gpu.release(self.plex_pid, self.plex_extra - target, gpu=card)
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


async def replay(
    ops: list[tuple[str, int]],
    *,
    gated: bool,
    seed: int,
    host: TraceHost = INCIDENT,
    queue: dict[str, object] | None = None,
) -> dict[str, object]:
    """One run of the trace on a fresh host (`queue`: the gate's queue section); its figures."""
    with tempfile.TemporaryDirectory(prefix="gpugate-trace-") as name:
        tmp = Path(name)
        ports, host_file, config = setup(host, tmp, gated=gated, queue=queue)
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
            gate = log = None
            others: list[str] = []
            metrics: Counter[int] = Counter()
            swaps = 0
            if gated:
                urls |= {"ollama": f"{local}{ports['listen']}",
                         "whisper": f"{local}{ports['whisper_listen']}",
                         "comfyui": f"{local}{ports['comfyui_listen']}"}  # fmt: skip
                gate = subprocess.Popen(
                    [sys.executable, "-m", "gpugate", "serve", "--config", str(config)],
                    env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                )  # fmt: skip
                log = LineReader(gate.stderr)
                LineReader(gate.stdout).until("gpugate: ready", timeout=30)
            else:
                urls |= {"ollama": f"{local}{ports['ollama']}",
                         "whisper": f"{local}{ports['whisper']}"}  # fmt: skip
            run = Run(gated, host, random.Random(seed), gpu, env, urls, plex_pid=plex)
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
                    if gated:
                        metrics = await overruns_counted(session, urls["control"])
                        swaps = await swaps_counted(session, urls["control"])
                elapsed = time.monotonic() - started
                events = gpu.ooms()
                ooms = Counter(o.name for o in events)
                by_card = Counter(o.gpu for o in events if not o.name.startswith("Plex"))
            finally:
                await run.systemctl("stop")
                if gate is not None:
                    gate.send_signal(signal.SIGTERM)
                    gate.wait(timeout=30)
    return {
        "ooms": ooms,
        "by_card": by_card,
        "outcomes": run.outcomes,
        "left": left,
        "seconds": elapsed,
        "overruns": overruns(metrics, [] if log is None else logged_events(log, others)),
        "tracebacks": tracebacks(others),
        "swaps": swaps,
    }


async def swaps_counted(session: aiohttp.ClientSession, control: str) -> int:
    """`gpugate_swaps_total` summed over consumers and cards, from the gate's /metrics."""
    async with session.get(control + "/metrics") as r:
        text = await r.text()
    return sum(
        int(sample.value)
        for family in text_string_to_metric_families(text)
        if family.name == "gpugate_swaps"
        for sample in family.samples
        if sample.name == "gpugate_swaps_total"
    )


def failure_classes(outcomes: Counter[str]) -> Counter[str]:
    """Outcomes that failed, by failure class: the gate's X-GPUGate-Failure where it named
    one; otherwise the status the runtime answered (`HTTP 500`) or the client's error."""
    counted: Counter[str] = Counter()
    for outcome, n in outcomes.items():
        _, _, rest = outcome.partition(": ")
        status, _, named = rest.partition(" ")
        if status.isdigit() and named.strip():
            counted[named.strip()] += n
        elif status.isdigit() and int(status) >= 400:
            counted[f"HTTP {status} (no failure class)"] += n
        elif rest.endswith(("Error", "Timeout")) or rest in ("work hit OOM", "start refused"):
            counted[rest] += n
    return counted


def tracebacks(lines: list[str]) -> list[str]:
    """The tracebacks among the gate's stderr lines that are no event, each as one text:
    from `Traceback` to the exception's own line (the first one not indented)."""
    found: list[list[str]] = []
    open_ = False
    for line in lines:
        if line.startswith("Traceback"):
            found.append([line])
            open_ = True
        elif open_:
            found[-1].append(line)
            open_ = line.startswith((" ", "\t")) or not line.strip()
    return ["\n".join(text) for text in found]


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


def table(requests: int, seed: int, direct: dict, gated: dict, host: TraceHost = INCIDENT) -> str:
    """The figures of both runs side by side."""
    comfy = [comfyui_ooms(r["ooms"]) for r in (direct, gated)]
    failures = [failure_classes(r["outcomes"]) for r in (direct, gated)]
    rows = [
        f"trace: {requests} operations, seed {seed}, on {host.name.value}",
        f"{'':28} {'direct':>10} {'gated':>10}",
        f"{'OOMs of admitted runtimes':28} {admitted_ooms(direct['ooms']):>10} "
        f"{admitted_ooms(gated['ooms']):>10}",
        *(
            f"{f'  on GPU {card}':28} {direct['by_card'].get(card, 0):>10} "
            f"{gated['by_card'].get(card, 0):>10}"
            for card in range(host.cards)
            if host.cards > 1
        ),
        f"{'  of which whisper aborts':28} {direct['ooms'].get('whisper-server', 0):>10} "
        f"{gated['ooms'].get('whisper-server', 0):>10}",
        f"{'  of which ComfyUI prompts':28} {comfy[0]:>10} {comfy[1]:>10}",
        *overrun_rows(gated["overruns"], host),
        f"{'leases left at the end':28} {'-':>10} {len(gated['left']):>10}",
        f"{'gate tracebacks':28} {'-':>10} {len(gated['tracebacks']):>10}",
        f"{'swaps (gpugate_swaps_total)':28} {'-':>10} {gated['swaps']:>10}",
        "failures by class:",
        *(
            f"{f'  {name}':28} {failures[0].get(name, 0):>10} {failures[1].get(name, 0):>10}"
            for name in sorted(set(failures[0]) | set(failures[1]))
        ),
        f"{'seconds':28} {direct['seconds']:>10.1f} {gated['seconds']:>10.1f}",
    ]  # fmt: skip
    for label, run in (("direct", direct), ("gated", gated)):
        rows.append(
            f"{label} outcomes: "
            + ", ".join(f"{k} {v}" for k, v in sorted(run["outcomes"].items()))
        )
        rows.append(f"{label} OOMs by process: {dict(run['ooms'])}")
    rows.extend(f"gate traceback:\n{text}" for text in gated["tracebacks"][:1])
    return "\n".join(rows)


async def main_async(
    requests: int, seed: int, host: TraceHost = INCIDENT, *, fifo: bool = False
) -> int:
    ops = trace_ops(requests, seed)
    direct = await replay(ops, gated=False, seed=seed, host=host)
    queue = {"swap_overtakes": 0} if fifo else None
    gated = await replay(ops, gated=True, seed=seed, host=host, queue=queue)
    print(table(requests, seed, direct, gated, host), flush=True)
    ok = admitted_ooms(gated["ooms"]) == 0 and not gated["left"] and not gated["tracebacks"]
    return 0 if ok else 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=20260729)
    parser.add_argument(
        "--host", choices=[h.value for h in HostName], default=HostName.INCIDENT.value
    )
    parser.add_argument(
        "--fifo",
        action="store_true",
        help="the gate's queue first come, first served (queue.swap_overtakes: 0)",
    )
    args = parser.parse_args()
    host = HOSTS[HostName(args.host)]
    return asyncio.run(main_async(args.requests, args.seed, host, fifo=args.fifo))


if __name__ == "__main__":
    sys.exit(main())
