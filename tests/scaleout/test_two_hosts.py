"""The worked example of docs/scale-out.md: two GPU hosts behind Debian's HAProxy.

Each host is a network namespace of its own with a simulated 16 GiB GPU, a simulated
Ollama and a gate (`gpugate sim run`, `gpugate serve`); a third namespace holds HAProxy
(tests/scaleout/haproxy.py: routing by the model in the body, agent checks per model) and
the test's client, linked to each host by a veth pair. Nothing is addressed outside them.

1. A model resident on host B is served by B, although it fits on A.
2. Filling host A (a batch job holds nearly all its memory in an explicit lease) moves
   new loads to B.
3. Stopping B's gate while requests keep coming fails over to A.
Throughout, no request is lost: every one sent gets a 200 with the runtime's answer, from
the host expected, and the two runtimes together answered exactly as many.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import attrs
import pytest

from tests.scaleout import netns
from tests.scaleout.haproxy import ROOM, Host, backend, haproxy_config, model_map
from tests.scaleout.hosts import (
    CONTROL,
    MODELS,
    OLLAMA,
    SIM,
    NamespacedHost,
    NamespacedProcess,
    Reply,
    call,
    gate_yaml,
    generate,
    haproxy_binary,
    haproxy_stat,
    host_yaml,
    until,
)

TOKEN = "scale-out-control-token"
SPELLINGS = {"bge-m3:latest": ["bge-m3"]}


@pytest.fixture
def namespaces_allowed() -> None:
    """Skips, saying why, where network namespaces cannot be made (not root, no iproute2)."""
    reason = netns.unavailable()
    if reason is not None:
        pytest.skip(reason)


# -- the example ---------------------------------------------------------------------------


@attrs.define
class Example:
    network: netns.Network
    directory: Path
    hosts: list[NamespacedHost] = attrs.field(factory=list)
    gates: list[NamespacedProcess] = attrs.field(factory=list)
    haproxy: NamespacedProcess | None = None
    sent: list[Reply] = attrs.field(factory=list)
    direct: int = 0
    """Requests sent straight to a gate (not through HAProxy)."""

    @property
    def socket(self) -> Path:
        return self.directory / "haproxy.sock"

    def address(self, i: int) -> str:
        return self.network.addresses[i][1]

    async def through_haproxy(self, model: str, prompt: str) -> Reply:
        reply = await self.network.hub.run(generate, "127.0.0.1", OLLAMA, model, prompt)
        self.sent.append(reply)
        return reply

    async def straight_to(self, i: int, model: str) -> Reply:
        self.direct += 1
        return await self.network.hub.run(generate, self.address(i), OLLAMA, model, "warm")

    async def control(self, i: int, method: str, path: str, body: Any = None) -> Any:
        status, _, data = await self.network.hub.run(
            call, self.address(i), CONTROL, method, path, body, TOKEN
        )
        assert status in (200, 201), (status, data)
        return json.loads(data)

    async def sim_counters(self, i: int) -> dict[str, int]:
        status, _, data = await self.network.hosts[i].run(
            call, "127.0.0.1", SIM, "GET", "/sim/state"
        )
        assert status == 200
        return json.loads(data)["counters"]

    async def stat(self) -> dict[tuple[str, str], dict[str, str]]:
        try:
            return await asyncio.to_thread(haproxy_stat, self.socket)
        except OSError:
            return {}  # not listening yet

    async def weights(self, model: str | None) -> dict[str, tuple[str, int]]:
        """Per host (a, b): (status, weight) in the model's backend (None: `hosts`)."""
        rows = await self.stat()
        name = "hosts" if model is None else backend(model)
        return {
            server: (row["status"], int(row["weight"] or 0))
            for (px, server), row in rows.items()
            if px == name and server not in ("FRONTEND", "BACKEND") and not server.endswith(ROOM)
        }


async def start_example(network: netns.Network, directory: Path) -> Example:
    example = Example(network, directory)
    for i, namespace in enumerate(network.hosts):
        home = directory / f"host{i}"
        home.mkdir()
        (home / "host.yaml").write_text(host_yaml())
        (home / "consumers.yaml").write_text(gate_yaml(example.address(i), TOKEN))
        host = NamespacedHost(namespace, home / "host.yaml", home / "state")
        example.hosts.append(host)
        await asyncio.to_thread(host.start)
    for i, namespace in enumerate(network.hosts):
        home = directory / f"host{i}"
        assert example.hosts[i].environment is not None
        gate = NamespacedProcess(
            namespace,
            [sys.executable, "-m", "gpugate", "serve", "--config", str(home / "consumers.yaml")],
            example.hosts[i].environment.apply(),
            home / "gate.log",
        )
        example.gates.append(gate)
    await asyncio.gather(*(asyncio.to_thread(g.start, "gpugate: ready") for g in example.gates))
    binary, env = haproxy_binary()
    hosts = [Host(name, example.address(i)) for i, name in enumerate("ab")]
    (directory / "models.map").write_text(model_map(SPELLINGS | {m: [] for m in MODELS}))
    config = haproxy_config(
        hosts,
        list(MODELS),
        bind=f"127.0.0.1:{OLLAMA}",
        map_file=directory / "models.map",
        stats_socket=example.socket,
    )
    (directory / "haproxy.cfg").write_text(config)
    checked = subprocess.run(
        [str(binary), "-c", "-f", str(directory / "haproxy.cfg")],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    example.haproxy = NamespacedProcess(
        network.hub,
        [str(binary), "-db", "-f", str(directory / "haproxy.cfg")],
        env,
        directory / "haproxy.log",
    ).start()
    # Every server up, and its agent heard: each model fits on both hosts.
    for model in (None, *MODELS):
        await until(
            lambda model=model: example.weights(model),
            lambda w: set(w) == {"a", "b"} and all(s == "UP" and n > 0 for s, n in w.values()),
            f"both hosts up in {model or 'hosts'}",
        )
    return example


async def stop_example(example: Example) -> None:
    if example.haproxy is not None:
        await asyncio.to_thread(example.haproxy.stop)
    await asyncio.gather(*(asyncio.to_thread(g.stop) for g in example.gates))
    await asyncio.gather(*(asyncio.to_thread(h.stop) for h in example.hosts))


@pytest.mark.usefixtures("namespaces_allowed")
async def test_two_hosts_behind_haproxy(tmp_path):
    began = time.monotonic()
    with netns.star(2) as network:
        example = await start_example(network, tmp_path)
        try:
            await scenario(example)
        finally:
            await stop_example(example)
    # HAProxy's checks, which it closes with a reset, leave nothing in the gates' logs.
    for gate in example.gates:
        lines = gate.log.read_text().splitlines()
        loud = [line for line in lines if line.startswith(("error ", "warning ", "critical "))]
        assert [line for line in loud if "agent" in line or "asyncio" in line] == [], loud
    print(f"two hosts behind HAProxy: {time.monotonic() - began:.1f}s")


async def scenario(example: Example) -> None:
    a, b = 0, 1
    llama, qwen, bge = "llama3.2:3b", "qwen2.5:7b", "bge-m3:latest"

    # 1. llama3.2:3b is resident on B: HAProxy sends every request for it there, though
    #    it would fit on A too.
    assert (await example.straight_to(b, llama)).answered()
    await until(
        lambda: example.weights(llama),
        lambda w: w["b"] == ("UP", 100) and w["a"][0] == "UP" and 0 < w["a"][1] < 100,
        "llama resident on B (100%), fits on A (< 100%)",
    )
    replies = [await example.through_haproxy(llama, f"one {n}") for n in range(8)]
    assert [r.served_by for r in replies] == ["b"] * 8, replies
    assert all(r.answered() for r in replies)
    assert (await example.sim_counters(a))["loads"] == 0

    # 2. A batch job holds nearly all of A's memory: A drains for every model it does not
    #    have, and new loads go to B.
    capacity = await example.control(a, "GET", "/gate/v1/capacity")
    room = capacity["gpus"][0]["schedulable"]
    lease = await example.control(
        a,
        "POST",
        "/gate/v1/leases",
        {"consumer": "ollama", "bytes": room - 64 * 2**20, "class": "production", "ttl": "10m"},
    )
    for model in (qwen, bge):
        await until(
            lambda model=model: example.weights(model),
            lambda w: w["a"][1] == 0 and w["b"] == ("UP", w["b"][1]) and w["b"][1] > 0,
            f"A drained for {model}",
        )
    await until(lambda: example.weights(None), lambda w: w["a"][1] == 0, "A drained as a host")
    full = await example.control(a, "GET", f"/gate/v1/capacity?model={qwen}")
    assert full["agent"]["state"] == "drain" and full["models"][0]["verdict"] == "no_room"
    replies = []
    for n in range(4):
        replies.append(await example.through_haproxy(qwen, f"two {n}"))
        replies.append(await example.through_haproxy("bge-m3", f"two {n}"))
    assert [r.served_by for r in replies] == ["b"] * 8, replies
    assert all(r.answered() for r in replies)
    assert (await example.sim_counters(a))["loads"] == 0
    on_b = await example.control(b, "GET", "/gate/v1/capacity")
    verdicts = {row["model"]: row["verdict"] for row in on_b["models"]}
    assert verdicts[qwen] == verdicts[bge] == verdicts[llama] == "resident"

    # 3. The job ends; then B's gate stops while requests for llama keep coming: those
    #    B was serving finish there, the rest go to A, none is lost.
    await example.control(a, "DELETE", f"/gate/v1/leases/{lease['id']}")
    await until(
        lambda: example.weights(llama),
        lambda w: w["b"] == ("UP", 100) and w["a"][0] == "UP" and 0 < w["a"][1] < 100,
        "A has room for llama again",
    )
    stopping = asyncio.Event()
    stopped_at: list[float] = []
    replies = []

    async def client(worker: int) -> None:
        n = 0
        while not stopping.is_set():
            replies.append(await example.through_haproxy(llama, f"three {worker} {n}"))
            n += 1

    workers = [asyncio.create_task(client(w)) for w in range(3)]
    try:
        await until(
            lambda: asyncio.sleep(0, len(replies)), lambda n: n >= 15, "requests served by B"
        )
        gate_b = example.gates[b]
        signalled = time.monotonic()
        gate_b.terminate()
        assert await asyncio.to_thread(gate_b.wait, 30) == 0
        stopped_at.append(time.monotonic())
        await until(
            lambda: asyncio.sleep(
                0, sum(1 for r in replies if r.started > stopped_at[0] and r.served_by == "a")
            ),
            lambda n: n >= 15,
            "requests served by A after B's gate stopped",
        )
    finally:
        stopping.set()
        await asyncio.gather(*workers)
    before = [r for r in replies if r.ended < signalled]
    after = [r for r in replies if r.started > stopped_at[0]]
    assert before and after
    assert {r.served_by for r in before} == {"b"}, before
    assert {r.served_by for r in after} == {"a"}, after
    assert all(r.answered() for r in replies), [r for r in replies if not r.answered()]

    # No request lost, none answered twice: every request sent through HAProxy got the
    # runtime's answer, and the two runtimes together generated exactly that many.
    assert all(r.answered() for r in example.sent)
    counters = [await example.sim_counters(i) for i in (a, b)]
    generated = sum(c["generations_completed"] + c["embeddings"] for c in counters)
    assert generated == len(example.sent) + example.direct, (counters, len(example.sent))
    served = {h: sum(1 for r in example.sent if r.served_by == h) for h in "ab"}
    rows = await example.stat()
    retried = sum(int(row["wretr"] or 0) for row in rows.values() if row["svname"] == "BACKEND")
    moved = sum(int(row["wredis"] or 0) for row in rows.values() if row["svname"] == "BACKEND")
    print(
        f"{len(example.sent)} requests through HAProxy, none lost: {served}; "
        f"{retried} retried, {moved} sent to another host"
    )
