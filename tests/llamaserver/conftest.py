"""llama.cpp's llama-server, real and simulated, started as subprocesses on free ports.

`llama_server_binary` is the CPU build `make build/llama-server` leaves (tests/llamaserver/
build.sh). `server_kind` is parametrized over `real` (that binary) and `sim` (`python -m
gpugate_sim.llamaserver` with the same argv); the server fixtures start one in single mode
(`-m FILE`) or router mode (`--models-dir D --models-max 2`), wait for `GET /health` to
answer 200, and stop it with SIGTERM, then SIGKILL, in teardown. Every server is the leader
of its own session, so the router's children (one per loaded model, in the router's
process group) are killed with it even if the router died first.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import attrs
import httpx
import pytest

from tests import buildcache
from tests.buildcache import tail
from tests.llamaserver.gguf_models import write_models_dir, write_tiny_llama
from tests.ports import free_port

ROOT = Path(__file__).resolve().parents[2]
BINARY = ROOT / "build" / "llama-server"
SIM_MODULE = "gpugate_sim.llamaserver"
ROUTER_MODELS = ("alpha", "beta", "gamma")
READY_SECONDS = 60.0
STOP_SECONDS = 10.0
VERSION = "0.3.36"
# One thread, a small context, one slot: the build machine has two cores.
COMMON_ARGS = ("--host", "127.0.0.1", "-t", "1", "-tb", "1", "-c", "512", "-np", "1")


@pytest.fixture(scope="session")
def llama_server_binary() -> Path:
    """build/llama-server; a failure, not a skip, when this machine could have built it."""
    return locate_binary(BINARY)


def locate_binary(binary: Path) -> Path:
    return buildcache.locate_binary(binary, "llama-server", VERSION)


@pytest.fixture(scope="module", params=["real", "sim"])
def server_kind(request: pytest.FixtureRequest) -> str:
    # A simulator that moved fails the suite rather than skipping the simulated half.
    if request.param == "sim" and importlib.util.find_spec(SIM_MODULE) is None:
        pytest.fail(f"no simulator at {SIM_MODULE}", pytrace=False)
    return str(request.param)


def command_for(kind: str, request: pytest.FixtureRequest) -> list[str]:
    if kind == "real":
        return [str(request.getfixturevalue("llama_server_binary"))]
    return [sys.executable, "-m", SIM_MODULE]


def child_pids(pid: int) -> list[int]:
    """The live processes whose parent is `pid` (from /proc), zombies excluded."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # pid (comm) state ppid ...: comm may hold spaces and parentheses
        state, ppid = stat.rsplit(")", 1)[1].split()[:2]
        if int(ppid) == pid and state != "Z":
            found.append(int(entry.name))
    return found


def pid_alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def wait_for(condition: Callable[[], bool], seconds: float, what: str) -> None:
    """Poll `condition` until it holds; fail with `what` after `seconds`."""
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {seconds:.0f}s waiting for {what}", pytrace=False)
        time.sleep(0.05)


@attrs.define
class LlamaServer:
    kind: str
    argv: list[str]
    port: int
    log_path: Path
    proc: subprocess.Popen[bytes]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int:
        return self.proc.pid

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    @property
    def is_router(self) -> bool:
        return "--models-dir" in self.argv

    def client(self, timeout: float = 120.0) -> httpx.Client:
        """An HTTP client; for a router, one that opens a new connection per request.

        The real router ends the connection after every proxied response without saying
        `Connection: close` (each is a stream, `server_http_proxy`'s `next`, and llama-server
        closes after every stream: runtimes/keepalive.py `LLAMA_HTTPLIB`), so a next
        request sent before the FIN arrives fails with "Server disconnected without
        sending a response" (about 1 in 100 proxied requests here).
        """
        if self.is_router:
            limits = httpx.Limits(max_keepalive_connections=0)
            return httpx.Client(base_url=self.url, timeout=timeout, limits=limits)
        return httpx.Client(base_url=self.url, timeout=timeout)

    def children(self) -> list[int]:
        return child_pids(self.pid)

    def wait_healthy(self, seconds: float = READY_SECONDS) -> None:
        deadline = time.monotonic() + seconds
        with httpx.Client(base_url=self.url, timeout=2.0) as client:
            while True:
                if self.proc.poll() is not None:
                    pytest.fail(
                        f"{self.kind} llama-server exited with {self.proc.returncode} before "
                        f"/health answered; argv {self.argv}\n{tail(self.log_path)}",
                        pytrace=False,
                    )
                with contextlib.suppress(httpx.TransportError):
                    if client.get("/health").status_code == 200:
                        return
                if time.monotonic() > deadline:
                    pytest.fail(
                        f"{self.kind} llama-server's /health not 200 after {seconds:.0f}s\n"
                        f"{tail(self.log_path)}",
                        pytrace=False,
                    )
                time.sleep(0.05)

    def stop(self) -> int | None:
        """SIGTERM, SIGKILL after STOP_SECONDS, then SIGKILL whatever is left of its group."""
        code = self.proc.poll()
        if code is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                code = self.proc.wait(STOP_SECONDS)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                code = self.proc.wait()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)  # orphaned router children, if any
        return code


def server_env(cache: Path) -> dict[str, str]:
    """The environment without LLAMA_ARG_*/HF_* settings, and an empty model cache."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LLAMA_ARG_", "HF_", "LLAMA_"))}
    env["LLAMA_CACHE"] = str(cache)
    return env


StartServer = Callable[..., LlamaServer]


@contextlib.contextmanager
def server_starter(
    kind: str, command: Sequence[str], directory: Path
) -> Iterator[Callable[[Sequence[str]], LlamaServer]]:
    started: list[LlamaServer] = []
    cache = directory / "llama-cache"
    cache.mkdir(parents=True, exist_ok=True)

    def start(args: Sequence[str], *, wait: bool = True) -> LlamaServer:
        port = free_port()
        argv = [*command, *args, *COMMON_ARGS, "--port", str(port)]
        log_path = directory / f"server-{port}.log"
        with log_path.open("wb") as log:
            proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=server_env(cache),
                start_new_session=True,
            )
        server = LlamaServer(kind, argv, port, log_path, proc)
        started.append(server)
        if wait:
            server.wait_healthy()
        return server

    try:
        yield start
    finally:
        for server in started:
            server.stop()


@pytest.fixture(scope="module")
def model_files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Single-mode models: `plain` (no FIM tokens) and `full` (FIM tokens, mean pooling)."""
    directory = tmp_path_factory.mktemp("gguf")
    return {
        "plain": write_tiny_llama(directory / "plain.gguf", seed=11),
        "full": write_tiny_llama(directory / "full.gguf", seed=12, embedding=True, fim=True),
    }


@pytest.fixture(scope="module")
def models_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Router mode's --models-dir: alpha.gguf, beta.gguf, gamma.gguf."""
    directory = tmp_path_factory.mktemp("models")
    write_models_dir(directory, ROUTER_MODELS)
    return directory


@pytest.fixture(scope="module")
def module_starter(
    server_kind: str, request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[StartServer]:
    command = command_for(server_kind, request)
    with server_starter(
        server_kind, command, tmp_path_factory.mktemp(f"{server_kind}-servers")
    ) as start:
        yield start


@pytest.fixture
def starter(
    server_kind: str, request: pytest.FixtureRequest, tmp_path: Path
) -> Iterator[StartServer]:
    """Start servers of this test's kind; each is stopped when the test ends."""
    with server_starter(server_kind, command_for(server_kind, request), tmp_path) as start:
        yield start


@pytest.fixture(scope="module")
def single_server(module_starter: StartServer, model_files: dict[str, Path]) -> LlamaServer:
    """Single mode with everything on: the FIM model, `--embeddings`."""
    return module_starter(["-m", str(model_files["full"]), "--embeddings"])


@pytest.fixture(scope="module")
def plain_server(module_starter: StartServer, model_files: dict[str, Path]) -> LlamaServer:
    """Single mode with defaults: a model without FIM tokens, no `--embeddings`."""
    return module_starter(["-m", str(model_files["plain"])])


def router_args(models_dir: Path, *extra: str) -> list[str]:
    return ["--models-dir", str(models_dir), "--models-max", "2", *extra]


@pytest.fixture
def router_server(starter: StartServer, models_dir: Path) -> LlamaServer:
    """A fresh router (`--models-dir D --models-max 2`) with nothing loaded."""
    return starter(router_args(models_dir))
