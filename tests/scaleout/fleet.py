"""A multi-node rehearsal: `python -m tests.scaleout.fleet --requests N --seed S`.

Three GPU hosts, each a network namespace of its own with a simulated 16 GiB card and a
simulated Ollama (`gpugate sim run`), linked by veth pairs to a hub namespace that holds
Debian's HAProxy and the clients (tests/scaleout/netns.py). One seeded trace is replayed
twice, on fresh hosts each time:

* **direct**: HAProxy shares the requests among the three Ollamas round robin, as a plain
  load balancer (or a Kubernetes Service) would; a batch job allocates its bytes on its
  host without asking anyone;
* **gated**: each host's gate fronts its Ollama, HAProxy routes by capacity with the
  configuration of docs/scale-out.md (tests/scaleout/haproxy.py: the model from the body,
  an agent check per model and host), and a batch job first takes an explicit lease from
  its host's gate. One gate is killed (SIGKILL) a third of the way through the trace and
  started again at two thirds, as systemd's `Restart=on-failure` would.

The trace is Ollama requests (80 %: four models whose envelopes add up to more than one
card holds, the smaller ones asked for more often) and batch jobs (20 %: 2 to 4 GiB held
for up to 1.5 s on a host the seed picks), at 8 concurrent clients.

Counted: OOMs on the three cards; what each request got (the runtime's answer, a gate's
refusal with its class, the runtime's error, or nothing: lost); how many of the answered
requests found their model loaded where they were sent (the simulated Ollama's
`load_duration`, as real Ollama reports it, is the time the request waited for its runner:
under a millisecond when the model was there); loads across the fleet; leases left at the
end. Exits 1 when the gated run has an OOM, a lost request or a lease left over.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

import attrs

from gpugate.core.units import GiB
from gpugate_sim.device import GpuOutOfMemory, SimulatedGpuHost
from tests.scaleout import netns
from tests.scaleout.fleet_parts import (
    CLASSES,
    CONCURRENCY,
    HOSTS,
    OPS,
    POPULARITY,
    TOKEN,
    Answer,
    Figures,
    ask,
    direct_config,
    table,
)
from tests.scaleout.haproxy import Host, haproxy_config, model_map
from tests.scaleout.hosts import (
    CONTROL,
    MODELS,
    OLLAMA,
    SIM,
    NamespacedHost,
    NamespacedProcess,
    call,
    gate_yaml,
    haproxy_binary,
    haproxy_stat,
    host_yaml,
    until,
)


def trace_ops(requests: int, seed: int) -> list[tuple[str, int]]:
    """The trace: each operation's kind and its own seed (the same in both runs)."""
    rng = random.Random(seed)
    kinds = [k for k, _ in OPS]
    weights = [w for _, w in OPS]
    return [(rng.choices(kinds, weights)[0], rng.randrange(2**32)) for _ in range(requests)]


def victim(seed: int) -> int:
    """The host whose gate is killed mid-run."""
    return random.Random(seed).randrange(len(HOSTS))


# -- one run -------------------------------------------------------------------------------


@attrs.define
class Fleet:
    """The three hosts, their gates (gated), HAProxy and the clients, for one run."""

    network: netns.Network
    directory: Path
    gated: bool
    hosts: list[NamespacedHost] = attrs.field(factory=list)
    gates: list[NamespacedProcess | None] = attrs.field(factory=list)
    haproxy: NamespacedProcess | None = None
    answers: list[Answer] = attrs.field(factory=list)
    batch: Counter[str] = attrs.field(factory=Counter)
    events: list[str] = attrs.field(factory=list)

    def address(self, i: int) -> str:
        return self.network.addresses[i][1]

    def home(self, i: int) -> Path:
        return self.directory / f"host-{HOSTS[i]}"

    def gpu(self, i: int) -> SimulatedGpuHost:
        return SimulatedGpuHost(self.home(i) / "state")

    async def start(self) -> None:
        for i, namespace in enumerate(self.network.hosts):
            home = self.home(i)
            home.mkdir()
            listen = f"127.0.0.1:{SIM}" if self.gated else f"{self.address(i)}:{OLLAMA}"
            (home / "host.yaml").write_text(host_yaml(listen))
            (home / "consumers.yaml").write_text(gate_yaml(self.address(i), TOKEN, CLASSES))
            self.hosts.append(NamespacedHost(namespace, home / "host.yaml", home / "state"))
        await asyncio.gather(*(asyncio.to_thread(h.start) for h in self.hosts))
        self.gates = [None] * len(self.hosts)
        if self.gated:
            await asyncio.gather(*(self.start_gate(i) for i in range(len(self.hosts))))
        await self.start_haproxy()

    async def start_gate(self, i: int) -> None:
        host = self.hosts[i]
        assert host.environment is not None
        argv = [sys.executable, "-m", "gpugate", "serve", "--config"]
        gate = NamespacedProcess(
            self.network.hosts[i],
            [*argv, str(self.home(i) / "consumers.yaml")],
            host.environment.apply(),
            self.home(i) / f"gate-{len(self.events)}.log",
        )
        self.gates[i] = gate
        await asyncio.to_thread(gate.start, "gpugate: ready", 60.0)

    async def start_haproxy(self) -> None:
        binary, env = haproxy_binary()
        socket = self.directory / "haproxy.sock"
        if self.gated:
            hosts = [Host(name, self.address(i)) for i, name in enumerate(HOSTS)]
            (self.directory / "models.map").write_text(
                model_map({"bge-m3:latest": ["bge-m3"]} | {m: [] for m in MODELS})
            )
            text = haproxy_config(
                hosts,
                list(MODELS),
                bind=f"127.0.0.1:{OLLAMA}",
                map_file=self.directory / "models.map",
                stats_socket=socket,
            )
        else:
            hosts = [Host(name, self.address(i)) for i, name in enumerate(HOSTS)]
            text = direct_config(hosts, bind=f"127.0.0.1:{OLLAMA}", stats_socket=socket)
        config = self.directory / "haproxy.cfg"
        config.write_text(text)
        checked = await asyncio.to_thread(
            subprocess.run,
            [str(binary), "-c", "-f", str(config)],
            env=env,
            capture_output=True,
            text=True,
            timeout=30,
        )
        if checked.returncode != 0:
            raise RuntimeError(f"haproxy -c: {checked.stdout}{checked.stderr}")
        self.haproxy = NamespacedProcess(
            self.network.hub, [str(binary), "-db", "-f", str(config)], env,
            self.directory / "haproxy.log",
        ).start()  # fmt: skip
        await until(self.all_up, bool, "every host up in HAProxy", timeout=60)

    async def all_up(self) -> bool:
        """Every server of every backend is up (gated: and its agent heard, weight > 0)."""
        try:
            rows = await asyncio.to_thread(haproxy_stat, self.directory / "haproxy.sock")
        except OSError:
            return False
        servers = [
            row for (_, server), row in rows.items() if server not in ("FRONTEND", "BACKEND")
        ]
        wanted = len(HOSTS) * ((2 * len(MODELS) + 2) if self.gated else 1)
        return len(servers) == wanted and all(
            row["status"] == "UP" and int(row["weight"] or 0) > 0 for row in servers
        )

    async def host_back(self, i: int) -> bool:
        """HAProxy's health check passes for host `i` in every backend (drained or not)."""
        try:
            rows = await asyncio.to_thread(haproxy_stat, self.directory / "haproxy.sock")
        except OSError:
            return False
        mine = [row for (_, server), row in rows.items() if server.startswith(HOSTS[i])]
        return bool(mine) and all(row["status"].startswith(("UP", "DRAIN")) for row in mine)

    async def kill_gate(self, i: int) -> None:
        gate = self.gates[i]
        assert gate is not None and gate.popen is not None
        gate.popen.send_signal(signal.SIGKILL)
        await asyncio.to_thread(gate.popen.wait, 30)
        self.gates[i] = None

    async def stop(self) -> None:
        if self.haproxy is not None:
            await asyncio.to_thread(self.haproxy.stop)
        await asyncio.gather(*(asyncio.to_thread(g.stop) for g in self.gates if g is not None))
        await asyncio.gather(*(asyncio.to_thread(h.stop) for h in self.hosts))

    # -- the operations ------------------------------------------------------------------

    async def ollama(self, n: int, seed: int) -> None:
        rng = random.Random(seed)
        model = rng.choices(list(POPULARITY), list(POPULARITY.values()))[0]
        answer = await self.network.hub.run(ask, model, rng.randrange(2**32))
        self.answers.append(attrs.evolve(answer, op=n))

    async def batch_job(self, seed: int) -> None:
        """A job that runs its own GPU process on a host: 2 to 4 GiB for up to 1.5 s."""
        rng = random.Random(seed)
        i = rng.randrange(len(HOSTS))
        nbytes = rng.choice([2, 3, 4]) * GiB
        hold = rng.uniform(0.2, 1.5)
        lease = None
        if self.gated:
            ask_for = {"consumer": "ollama", "bytes": nbytes, "class": rng.choice(CLASSES),
                       "ttl": 5, "max_wait": 20}  # fmt: skip
            try:
                status, headers, data = await self.network.hub.run(
                    call, self.address(i), CONTROL, "POST", "/gate/v1/leases", ask_for, TOKEN
                )
            except OSError:
                self.batch["gate down, not run"] += 1
                return
            if status != 201:
                self.batch[f"refused {status} {headers.get('x-gpugate-failure')}"] += 1
                return
            lease = json.loads(data)["id"]
        gpu = self.gpu(i)
        try:
            await asyncio.to_thread(gpu.allocate, os.getpid(), nbytes, name="batch-job")
        except GpuOutOfMemory:
            self.batch["hit OOM"] += 1
        else:
            await asyncio.sleep(hold)
            await asyncio.to_thread(gpu.release, os.getpid(), nbytes, gpu=0)
            self.batch["worked"] += 1
        finally:
            if lease is not None:
                path = f"/gate/v1/leases/{lease}"
                try:
                    await self.network.hub.run(
                        call, self.address(i), CONTROL, "DELETE", path, None, TOKEN
                    )
                except OSError:
                    self.batch["lease outlived its gate"] += 1

    async def leases_left(self, settle: float = 15.0) -> int:
        """The leases the gates still hold once the trace is over."""
        deadline = time.monotonic() + settle
        while True:
            held = 0
            for i, gate in enumerate(self.gates):
                if gate is None:
                    continue
                status, _, data = await self.network.hub.run(
                    call, self.address(i), CONTROL, "GET", "/gate/v1/status", None, TOKEN
                )
                assert status == 200, data
                held += len(json.loads(data)["leases"])
            if not held or time.monotonic() > deadline:
                return held
            await asyncio.sleep(0.2)

    async def loads(self) -> int:
        total = 0
        for i, namespace in enumerate(self.network.hosts):
            status, _, data = await namespace.run(
                call, self.address(i) if not self.gated else "127.0.0.1",
                OLLAMA if not self.gated else SIM, "GET", "/sim/state",
            )  # fmt: skip
            assert status == 200, data
            total += json.loads(data)["counters"]["loads"]
        return total


async def replay(ops: list[tuple[str, int]], *, gated: bool, seed: int) -> Figures:
    """One run of the trace on three fresh hosts."""
    kill_at, restart_at = len(ops) // 3, 2 * len(ops) // 3
    down = victim(seed)
    with tempfile.TemporaryDirectory(prefix="gpugate-fleet-") as name, netns.star(
        len(HOSTS), hub_threads=CONCURRENCY + 2
    ) as network:  # fmt: skip
        fleet = Fleet(network, Path(name), gated)
        try:
            await fleet.start()
            started = time.monotonic()
            pending = iter(enumerate(ops))
            # The clients wait while the killed gate starts again and HAProxy takes its host
            # back (the operations after it are meant to reach it); the kill does not wait.
            back = asyncio.Event()
            back.set()

            async def worker() -> None:
                for n, (kind, op_seed) in pending:
                    if gated and n == kill_at:
                        await fleet.kill_gate(down)
                        fleet.events.append(f"gate {HOSTS[down]} killed at operation {n}")
                    if gated and n == restart_at:
                        back.clear()
                        await fleet.start_gate(down)
                        await until(
                            lambda: fleet.host_back(down), bool, "the host back", timeout=60
                        )
                        fleet.events.append(f"gate {HOSTS[down]} started at operation {n}")
                        back.set()
                    await back.wait()
                    if kind == "ollama":
                        await fleet.ollama(n, op_seed)
                    else:
                        await fleet.batch_job(op_seed)

            await asyncio.gather(*(worker() for _ in range(CONCURRENCY)))
            elapsed = time.monotonic() - started
            left = await fleet.leases_left() if gated else 0
            loads = await fleet.loads()
            ooms: Counter[str] = Counter()
            for i in range(len(HOSTS)):
                for event in fleet.gpu(i).ooms():
                    ooms[f"{HOSTS[i]}: {event.name or event.pid}"] += 1
        finally:
            await fleet.stop()
    return Figures(ooms, fleet.answers, fleet.batch, loads, left, fleet.events, elapsed)


def passed(gated: Figures) -> bool:
    return not gated.ooms and not gated.outcomes["lost"] and not gated.leases_left


async def main_async(requests: int, seed: int) -> int:
    ops = trace_ops(requests, seed)
    direct = await replay(ops, gated=False, seed=seed)
    gated = await replay(ops, gated=True, seed=seed)
    print(table(requests, seed, direct, gated), flush=True)
    return 0 if passed(gated) else 1


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--requests", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=20261207)
    args = parser.parse_args(argv)
    reason = netns.unavailable()
    if reason is not None:
        print(f"fleet: cannot run: {reason}", file=sys.stderr)
        return 1
    return asyncio.run(main_async(args.requests, args.seed))


if __name__ == "__main__":
    sys.exit(main())
