"""What the scale-out tests run inside network namespaces: a simulated host and its gate's
files, a command with its log, HAProxy as `make test` unpacks it, and the client calls made
from threads inside a namespace (tests/scaleout/netns.py)."""

from __future__ import annotations

import asyncio
import csv
import http.client
import io
import json
import signal
import socket
import subprocess
import textwrap
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import attrs

from gpugate_sim.hostprocess import SimulatedHostProcess
from tests.scaleout import netns
from tests.scaleout.haproxy import HAPROXY_LIBS
from tests.sim.processes import LineReader

ROOT = Path(__file__).resolve().parents[2]
UNPACKED = ROOT / "build" / "haproxy"
T = TypeVar("T")
MODELS = {"llama3.2:3b": 3200, "qwen2.5:7b": 5700, "bge-m3:latest": 2012, "gemma3:12b": 7796}
"""The gate's name of each model → MiB (the runtime's size and the configured envelope):
18.3 GiB together, more than one 16 GiB card holds beside its reserve."""
OLLAMA = 11434
CONTROL = 9411
AGENT = 9412
SIM = 11435


# -- a host's files ------------------------------------------------------------------------


def host_yaml(listen: str = f"127.0.0.1:{SIM}") -> str:
    """The simulated host: one 16 GiB card and an Ollama on `listen` that has `MODELS`."""
    models = "".join(
        f"    - {{name: '{name}', size: {mib}MiB, load_seconds: 0.05, "
        f"embedding: {str(name.startswith('bge')).lower()}}}\n"
        for name, mib in MODELS.items()
    )
    return (
        textwrap.dedent(f"""\
        gpus:
          - {{name: NVIDIA GeForce RTX 4080, total: 16GiB, reserved: 434MiB}}
        ollama:
          listen: {listen}
          tokens_per_second: 2000
          keep_alive: 5m
          models:
        """)
        + models
    )


def gate_yaml(address: str, token: str, classes: Sequence[str] = ()) -> str:
    """The gate on `address` in front of the host's Ollama, its control API open to
    `token`; each of `classes`, if given, waits up to 20 s for room."""
    waits = "".join(f"  {name}: {{max_wait: 20s}}\n" for name in classes)
    models = "".join(f"      {name}: {{envelope: {mib}MiB}}\n" for name, mib in MODELS.items())
    return (
        textwrap.dedent(f"""\
        gate:
          control: {address}:{CONTROL}
          control_public: true
          control_tokens: ["{token}"]
          agent_check: {address}:{AGENT}
          shutdown_grace: 5s
        budget:
          reserve: 1GiB
          reserve_max: 1GiB
          sample_interval: 100ms
          stale_after: 5s
          reclaim_timeout: 3s
        """)
        + ("classes:\n" + waits if classes else "")
        + textwrap.dedent(f"""\
        consumers:
          ollama:
            runtime: ollama
            listen: {address}:{OLLAMA}
            upstream: http://127.0.0.1:{SIM}
            class: interactive
            residency: {{policy: keep_warm, ttl: 15m}}
            processes: {{commands: ["ollama serve"]}}
            models:
        """)
        + models
    )


def haproxy_binary() -> tuple[Path, dict[str, str]]:
    """Debian's HAProxy as `make test` unpacks it (or one installed), with its libraries."""
    unpacked = UNPACKED / "usr" / "sbin" / "haproxy"
    if unpacked.exists():
        return unpacked, {"LD_LIBRARY_PATH": str(UNPACKED / HAPROXY_LIBS)}
    installed = Path("/usr/sbin/haproxy")
    if installed.exists():
        return installed, {}
    raise FileNotFoundError(
        "no HAProxy: `make test` unpacks Debian's haproxy into build/haproxy first"
    )


class NamespacedHost(SimulatedHostProcess):
    """`gpugate sim run` inside a network namespace."""

    def __init__(self, namespace: netns.Namespace, host_file: Path, state_dir: Path) -> None:
        super().__init__(host_file, state_dir)
        self.namespace = namespace

    def command(self) -> list[str]:
        return self.namespace.argv(super().command())


@attrs.define
class NamespacedProcess:
    """A command inside a network namespace, its stderr in a log file."""

    namespace: netns.Namespace
    argv: list[str]
    env: dict[str, str]
    log: Path
    popen: subprocess.Popen[str] | None = None
    stdout: LineReader | None = None

    def start(self, ready: str | None = None, timeout: float = 30.0) -> NamespacedProcess:
        with self.log.open("w") as log:
            self.popen = subprocess.Popen(
                self.namespace.argv(self.argv),
                env=self.env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=log,
                text=True,
            )
        self.stdout = LineReader(self.popen.stdout)
        if ready is not None:
            try:
                self.stdout.until(ready, timeout=timeout)
            except AssertionError as exc:
                raise AssertionError(f"{exc}\n{self.log.read_text()[-3000:]}") from None
        return self

    def terminate(self) -> None:
        if self.popen is not None and self.popen.poll() is None:
            self.popen.send_signal(signal.SIGTERM)

    def wait(self, timeout: float) -> int | None:
        assert self.popen is not None
        try:
            return self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            return None

    def stop(self, timeout: float = 20.0) -> None:
        if self.popen is None or self.popen.poll() is not None:
            return
        self.terminate()
        if self.wait(timeout) is None:
            self.popen.kill()
            self.popen.wait(10)


# -- talking to them (from threads inside the namespaces) ------------------------------------


@attrs.frozen
class Reply:
    model: str
    status: int
    served_by: str | None
    body: bytes
    started: float
    ended: float
    error: str = ""

    def answered(self) -> bool:
        """A 200 carrying the runtime's own answer for the model asked."""
        if self.status != 200:
            return False
        try:
            document = json.loads(self.body)
        except ValueError:
            return False
        named = document.get("model") in (self.model, f"{self.model}:latest")
        return named and (document.get("done") is True or bool(document.get("embeddings")))


def call(
    host: str, port: int, method: str, path: str, body: Any = None, token: str | None = None
) -> tuple[int, dict[str, str], bytes]:
    connection = http.client.HTTPConnection(host, port, timeout=60)
    try:
        headers = {"Content-Type": "application/json"}
        if token:
            headers["Authorization"] = f"Bearer {token}"
        data = None if body is None else json.dumps(body)
        connection.request(method, path, data, headers)
        response = connection.getresponse()
        return response.status, {k.lower(): v for k, v in response.getheaders()}, response.read()
    finally:
        connection.close()


def generate(host: str, port: int, model: str, prompt: str) -> Reply:
    """A generation, or for an embedding model an embedding, as an Ollama client asks."""
    started = time.monotonic()
    if model.startswith("bge-m3"):
        path, body = "/api/embed", {"model": model, "input": prompt}
    else:
        path = "/api/generate"
        body = {"model": model, "prompt": prompt, "stream": False, "options": {"num_predict": 4}}
    try:
        status, headers, data = call(host, port, "POST", path, body)
    except (OSError, http.client.HTTPException) as exc:
        return Reply(model, 0, None, b"", started, time.monotonic(), repr(exc))
    return Reply(model, status, headers.get("x-served-by"), data, started, time.monotonic())


def haproxy_stat(sock: Path) -> dict[tuple[str, str], dict[str, str]]:
    """`show stat` on HAProxy's socket: (backend, server) → its row."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(5)
        s.connect(str(sock))
        s.sendall(b"show stat\n")
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    text = data.decode().lstrip("# ")
    return {(row["pxname"], row["svname"]): row for row in csv.DictReader(io.StringIO(text))}


async def until(
    probe: Callable[[], Awaitable[T]], check: Callable[[T], bool], what: str, timeout: float = 20.0
) -> T:
    deadline = time.monotonic() + timeout
    while True:
        value = await probe()
        if check(value):
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout}s: {what}; last: {value!r}")
        await asyncio.sleep(0.05)
