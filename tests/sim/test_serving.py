"""The entry the simulated servers' processes share (gpugate_sim/serving.py): a server serves
until the first stop signal and is closed, a second signal reaches the server's own hard
exit, a port it cannot bind is its exit code, and a launcher's blocked stop signals are taken
back. Each case runs in a process of its own: the signals are real."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import threading
import urllib.request

from gpugate_sim.serverprocess import child_env
from tests.sim.processes import LineReader

SERVER = """
import asyncio, sys
from aiohttp import web
from gpugate_sim.serving import AppSite, serve_until_signal

port = int(sys.argv[1])
hang = sys.argv[2] == "hang"

async def hello(request):
    return web.Response(text="hello")

async def main():
    app = web.Application()
    app.router.add_get("/", hello)
    site = AppSite(
        app, "127.0.0.1", port, reuse_address=False,
        bind_failed=lambda exc: print("cannot bind", exc.errno, flush=True) or 5,
        listening=lambda: print("LISTENING", site.bound()[1], flush=True),
    )

    async def close():
        print("closing", flush=True)
        if hang:
            await asyncio.Event().wait()
        await site.close()
        print("closed", flush=True)

    def second(signum):
        print("second", signum, flush=True)
        sys.stdout.flush()
        import os
        os._exit(7)

    return await serve_until_signal(
        site.start, close, first=lambda signum: print("first", signum, flush=True),
        second=second,
    )

sys.exit(asyncio.run(main()))
"""


def spawn(port: int, mode: str = "close") -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", SERVER, str(port), mode],
        stdout=subprocess.PIPE,
        text=True,
        env=child_env(),
    )


def listening_port(reader: LineReader) -> int:
    return int(reader.until("LISTENING").split()[1])


def test_the_first_stop_signal_closes_the_server_and_exits_0():
    proc = spawn(0)
    try:
        reader = LineReader(proc.stdout)
        port = listening_port(reader)
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=30) as answer:
            assert answer.read() == b"hello"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
        assert reader.next() == f"first {int(signal.SIGTERM)}"
        assert reader.next() == "closing"
        assert reader.next() == "closed"
        with socket.socket() as probe:
            assert probe.connect_ex(("127.0.0.1", port)) != 0, "still listening after it exited"
    finally:
        proc.kill()
        proc.wait(timeout=30)


def test_a_second_stop_signal_reaches_the_servers_hard_exit():
    proc = spawn(0, "hang")
    try:
        reader = LineReader(proc.stdout)
        listening_port(reader)
        proc.send_signal(signal.SIGINT)
        assert reader.next() == f"first {int(signal.SIGINT)}"
        assert reader.next() == "closing"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 7
        assert reader.next() == f"second {int(signal.SIGTERM)}"
    finally:
        proc.kill()
        proc.wait(timeout=30)


def test_a_port_it_cannot_bind_is_its_exit_code():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        proc = spawn(taken.getsockname()[1])
        try:
            assert proc.wait(timeout=60) == 5
            assert proc.stdout is not None
            out = proc.stdout.read()
            assert out.startswith("cannot bind 98"), out
            assert "LISTENING" not in out and "closing" not in out
        finally:
            proc.kill()
            proc.wait(timeout=30)


def test_stop_signals_a_launcher_blocked_are_taken_back():
    started: list[subprocess.Popen[str]] = []

    def launch() -> None:
        # A thread that blocks the stop signals, as a simulated host's reader threads do:
        # the child inherits the mask across exec.
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGINT})
        started.append(spawn(0))

    launcher = threading.Thread(target=launch)
    launcher.start()
    launcher.join(timeout=30)
    [proc] = started
    try:
        reader = LineReader(proc.stdout)
        listening_port(reader)
        blocked = _signal_mask(proc.pid, "SigBlk")
        assert not blocked & (1 << (signal.SIGTERM - 1)), "SIGTERM is still blocked"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    finally:
        proc.kill()
        proc.wait(timeout=30)


def _signal_mask(pid: int, field: str) -> int:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1], 16)
    raise AssertionError(f"no {field} in /proc/{pid}/status")
