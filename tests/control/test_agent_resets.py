"""The agent-check responder logs nothing of a peer that leaves: HAProxy closes each check
once it has its line, often with a reset, and may reset one before the answer is written.
On uvloop (what `gpugate serve` runs on) that write raised RuntimeError, logged as the
loop's own line ("unable to perform operation on <TCPTransport closed=True ...>; the
handler is closed") on every such check, as the two-host example's gate logs showed. What is
unexpected is logged once a minute with a count, in the gate's words."""

from __future__ import annotations

import asyncio
import logging
import socket
import struct

import pytest
import uvloop

import gpugate.control.agent as agent_module
from tests.control.test_capacity import capacity_gate

LOOPS = {"asyncio": asyncio.new_event_loop, "uvloop": uvloop.new_event_loop}
CHECKS = 20


def reset(sock: socket.socket) -> None:
    """Close with a reset (SO_LINGER 0), as HAProxy closes its checks."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()


def run(loop: str, main) -> None:
    with asyncio.Runner(loop_factory=LOOPS[loop]) as runner:
        runner.run(main())


def logged(caplog: pytest.LogCaptureFixture) -> list[str]:
    """What the loop and the responder logged at warning or above."""
    return [
        f"{r.name}: {r.getMessage()}"
        for r in caplog.records
        if r.levelno >= logging.WARNING and r.name.startswith(("asyncio", "gpugate"))
    ]


@pytest.mark.parametrize("loop", sorted(LOOPS))
def test_checks_reset_by_their_peer_log_nothing(tmp_path, caplog, loop):
    caplog.set_level(logging.DEBUG)

    async def main() -> None:
        async with capacity_gate(tmp_path) as cap:
            host, port = cap.agent.bound
            running = asyncio.get_running_loop()
            for n in range(CHECKS):
                sock = socket.socket()
                sock.setblocking(False)
                await running.sock_connect(sock, (host, port))
                # Half of them ask and leave at once; the others leave after the answer.
                await running.sock_sendall(sock, b"qwen2.5:7b\n")
                if n % 2:
                    assert (await running.sock_recv(sock, 100)).startswith(b"up ready ")
                reset(sock)
            agent = cap.agent

            async def settled() -> None:
                while agent.active or agent.answered + agent.dropped + agent.failed < CHECKS:
                    await asyncio.sleep(0.01)

            await asyncio.wait_for(settled(), 60)
            # The responder answers the next check as before.
            assert await cap.ask(b"\n") == (await cap.get())[1]["agent"]["line"] + "\n"
            assert (cap.agent.failed, cap.agent.active) == (0, 0)
            assert cap.agent.answered >= CHECKS // 2

    run(loop, main)
    assert logged(caplog) == []


def test_what_is_unexpected_is_logged_once_with_a_count_and_no_raw_line(
    tmp_path, caplog, monkeypatch
):
    caplog.set_level(logging.DEBUG)

    def broken(gate, line):
        raise RuntimeError("unable to perform operation on <Something 0x1>; the handler is closed")

    async def main() -> None:
        async with capacity_gate(tmp_path) as cap:
            monkeypatch.setattr(agent_module, "agent_answer", broken)
            for _ in range(5):
                assert await cap.ask(b"qwen2.5:7b\n") == ""
            assert (cap.agent.failed, cap.agent.answered, cap.agent.active) == (5, 0, 0)
            limiter = cap.agent._limiter
            limiter.clock = lambda: float("inf")
            monkeypatch.undo()
            monkeypatch.setattr(agent_module, "agent_answer", broken)
            assert await cap.ask(b"\n") == ""

    run("uvloop", main)
    assert logged(caplog) == [
        "gpugate.control.agent: agent-check: a check ended with an unexpected RuntimeError; "
        "the next are answered",
        "gpugate.control.agent: agent-check: a check ended with an unexpected RuntimeError; "
        "the next are answered (and 4 more like it in the last 60s)",
    ]
