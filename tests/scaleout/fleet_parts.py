"""The parts of the three-host rehearsal (tests/scaleout/fleet.py): the hosts' and gates'
files, the plain load balancer of the direct run, one client request and what it got, and
the figures of a run with their table."""

from __future__ import annotations

import http.client
import json
import random
import textwrap
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

import attrs

from tests.scaleout.haproxy import Host
from tests.scaleout.hosts import OLLAMA

TOKEN = "fleet-control-token"
HOSTS = "abc"
POPULARITY = {"llama3.2:3b": 35, "bge-m3:latest": 25, "qwen2.5:7b": 25, "gemma3:12b": 15}
OPS = (("ollama", 80), ("batch", 20))
CONCURRENCY = 8
RESIDENT_NS = 1_000_000
"""A runner that was ready when the request came reports a load_duration of microseconds;
a load takes the simulated model's 50 ms at least."""
CLASSES = ("production", "interactive", "background")


def direct_config(hosts: Sequence[Host], *, bind: str, stats_socket: Path) -> str:
    """A plain load balancer in front of the runtimes: round robin, a health check, and
    the same retries as the gated configuration."""
    servers = "".join(f"    server {h.name} {h.address}:{h.port}\n" for h in hosts)
    return (
        textwrap.dedent(f"""\
        global
            stats socket {stats_socket} mode 600 level admin
        defaults
            mode http
            timeout connect 1s
            timeout client 90s
            timeout server 90s
            timeout check 1s
            retries 3
            option redispatch 1
            retry-on conn-failure empty-response junk-response
            option http-buffer-request
            default-server check inter 300ms fall 1 rise 1

        frontend ollama
            bind {bind}
            default_backend hosts

        backend hosts
            balance roundrobin
            option httpchk GET /api/version
            http-response set-header X-Served-By %[srv_name]
        """)
        + servers
    )


# -- what a request got --------------------------------------------------------------------


@attrs.frozen
class Answer:
    """One Ollama request through HAProxy, as the client saw it."""

    status: int
    served_by: str | None
    failure: str | None
    """The gate's X-GPUGate-Failure: a refusal with its class."""
    load_ns: int | None
    """The runtime's load_duration, when it answered."""
    error: str = ""
    op: int = -1
    """The operation's place in the trace."""

    @property
    def outcome(self) -> str:
        if self.load_ns is not None:
            return "answered"
        if self.failure:
            return "refused"
        if self.status == 500:
            return "runtime error"
        return "lost"


def ask(model: str, seed: int) -> Answer:
    """A generation, or for an embedding model an embedding, at HAProxy's Ollama port."""
    rng = random.Random(seed)
    if model.startswith("bge-m3"):
        path, body = "/api/embed", {"model": "bge-m3", "input": ["a", "b"]}
    else:
        path = "/api/generate"
        body = {"model": model, "prompt": "q", "stream": False,
                "options": {"num_predict": rng.randint(1, 8)}}  # fmt: skip
    connection = http.client.HTTPConnection("127.0.0.1", OLLAMA, timeout=90)
    try:
        connection.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
        response = connection.getresponse()
        data = response.read()
    except (OSError, http.client.HTTPException) as exc:
        return Answer(0, None, None, None, repr(exc))
    finally:
        connection.close()
    served_by = response.getheader("X-Served-By")
    failure = response.getheader("X-GPUGate-Failure")
    load_ns = None
    if response.status == 200:
        try:
            document = json.loads(data)
        except ValueError:
            document = {}
        if document.get("model", "").split(":")[0] == model.split(":")[0]:
            load_ns = int(document.get("load_duration", 0))
    error = "" if load_ns is not None else data[:200].decode(errors="replace")
    return Answer(response.status, served_by, failure, load_ns, error)


@attrs.frozen
class Figures:
    """What one run counted."""

    ooms: Counter[str]
    answers: list[Answer]
    batch: Counter[str]
    loads: int
    leases_left: int
    events: list[str]
    seconds: float

    @property
    def outcomes(self) -> Counter[str]:
        return Counter(a.outcome for a in self.answers)

    @property
    def resident(self) -> int:
        return sum(1 for a in self.answers if a.load_ns is not None and a.load_ns < RESIDENT_NS)

    def served_by(self, host: str) -> int:
        return sum(1 for a in self.answers if a.served_by == host and a.load_ns is not None)


def share(part: int, whole: int) -> str:
    return f"{part}/{whole} {100 * part / whole:.0f}%" if whole else "-"


def table(requests: int, seed: int, direct: Figures, gated: Figures) -> str:
    """The figures of both runs side by side."""
    rows = [(label, str(d), str(g)) for label, d, g in [
        ("OOMs on the three cards", sum(direct.ooms.values()), sum(gated.ooms.values())),
        ("Ollama requests", len(direct.answers), len(gated.answers)),
        ("  answered by the runtime", direct.outcomes["answered"], gated.outcomes["answered"]),
        ("  refused by a gate, classed", "-", gated.outcomes["refused"]),
        ("  failed at the runtime", direct.outcomes["runtime error"],
         gated.outcomes["runtime error"]),
        ("  lost", direct.outcomes["lost"], gated.outcomes["lost"]),
        ("found their model loaded", share(direct.resident, direct.outcomes["answered"]),
         share(gated.resident, gated.outcomes["answered"])),
        ("Ollama loads on the cards", direct.loads, gated.loads),
        ("answered by a / b / c", "/".join(str(direct.served_by(h)) for h in HOSTS),
         "/".join(str(gated.served_by(h)) for h in HOSTS)),
        ("batch jobs worked", direct.batch["worked"], gated.batch["worked"]),
        ("  hit OOM", direct.batch["hit OOM"], gated.batch["hit OOM"]),
        ("  refused or gate down", "-",
         sum(n for k, n in gated.batch.items() if k not in ("worked", "hit OOM"))),
        ("leases left at the end", "-", gated.leases_left),
        ("seconds", f"{direct.seconds:.1f}", f"{gated.seconds:.1f}"),
    ]]  # fmt: skip
    lines = [
        f"fleet: 3 hosts × 16 GiB behind HAProxy, {requests} operations, seed {seed}",
        f"{'':32} {'direct':>12} {'gated':>12}",
        *(f"{label:32} {d:>12} {g:>12}" for label, d, g in rows),
        f"gated: {'; '.join(gated.events)}",
    ]
    for label, run in (("direct", direct), ("gated", gated)):
        lines.append(f"{label} OOMs by host and process: {dict(run.ooms)}")
        lines.append(f"{label} batch jobs: {dict(run.batch)}")
        refusals = Counter(a.failure for a in run.answers if a.outcome == "refused")
        if refusals:
            lines.append(f"{label} refusals: {dict(refusals)}")
        lost = [a for a in run.answers if a.outcome == "lost"]
        if lost:
            lines.append(
                f"{label} lost: {Counter((a.status, a.served_by, a.error[:120]) for a in lost)}"
            )
    return "\n".join(lines)
