"""A client that half-closes once its request is sent, in front of the real llama-server
(cpp-httplib reads nothing more of a connection while its handler runs): through the gate
it gets what it gets directly, a non-streamed completion whole and a stream cut after its
head where llama-server sees the end, and the gate's lease ends with the answer."""

from __future__ import annotations

import asyncio
import json
import socket
from pathlib import Path

import httpx
import pytest

from gpugate.core.effects import EventKind
from gpugate.core.residents import ResidentKey
from tests.llamaserver.gguf_models import write_tiny_llama
from tests.llamaserver.test_single_through_gate import CONFIG_EXTRA
from tests.llamaserver.test_through_gate import gate_before
from tests.ports import free_ports


def half_closed(port: int, body: dict[str, object]) -> bytes:
    """POST /completion, the client's side ended at once; everything until the close."""
    data = json.dumps(body).encode()
    with socket.create_connection(("127.0.0.1", port), timeout=60) as sock:
        sock.sendall(
            b"POST /completion HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n%b" % (len(data), data)
        )
        sock.shutdown(socket.SHUT_WR)
        got = b""
        while chunk := sock.recv(65536):
            got += chunk
    return got


def status_and_names(answer: bytes) -> tuple[bytes, list[bytes]]:
    head = answer.split(b"\r\n\r\n", 1)[0].split(b"\r\n")
    names = [line.split(b":", 1)[0].lower() for line in head[1:]]
    return head[0], [n for n in names if n != b"date" and not n.startswith(b"x-gpugate-")]


@pytest.fixture
def model(tmp_path: Path) -> Path:
    return write_tiny_llama(tmp_path / "single.gguf", seed=5)


async def test_a_half_closed_client_gets_what_llama_server_gives_it(
    llama_server_binary, model, tmp_path, sim_host, fakenvml_path
):
    listen, upstream, router_port = free_ports(3)
    command = [str(llama_server_binary), "-m", str(model), "--host", "127.0.0.1",
               "--port", str(upstream), "-t", "1", "-c", "512", "-np", "1"]  # fmt: skip
    extra = CONFIG_EXTRA.format(
        listen=listen, upstream=upstream, model=model, command=json.dumps(command)
    )
    key = ResidentKey("single", str(model))
    async with gate_before(
        f"http://127.0.0.1:{router_port}", tmp_path, fakenvml_path, extra=extra
    ) as gated:
        async with httpx.AsyncClient(timeout=60) as client:
            started = await client.post(
                f"http://127.0.0.1:{listen}/completion", json={"prompt": "a", "n_predict": 1}
            )
            assert started.status_code == 200  # the gate started it

        whole = {"prompt": "hello", "n_predict": 64, "stream": False}
        direct = await asyncio.to_thread(half_closed, upstream, whole)
        released = gated.gate.events.next(
            lambda e: e.kind is EventKind.LEASE_RELEASED and e.key == key
        )
        gated_answer = await asyncio.to_thread(half_closed, listen, whole)
        await asyncio.wait_for(released, 30)
        assert status_and_names(gated_answer) == status_and_names(direct)
        assert status_and_names(direct)[0] == b"HTTP/1.1 200 OK"
        for answer in (direct, gated_answer):
            completion = json.loads(answer.split(b"\r\n\r\n", 1)[1])
            assert completion["tokens_predicted"] == 64

        stream = {"prompt": "hello", "n_predict": 400, "stream": True}
        direct = await asyncio.to_thread(half_closed, upstream, stream)
        released = gated.gate.events.next(
            lambda e: e.kind is EventKind.LEASE_RELEASED and e.key == key
        )
        gated_answer = await asyncio.to_thread(half_closed, listen, stream)
        await asyncio.wait_for(released, 30)
        assert status_and_names(gated_answer)[0] == status_and_names(direct)[0]
        for answer in (direct, gated_answer):
            # llama-server stops the stream where it sees the client's end: far fewer
            # than 400 tokens, and no last chunk
            assert answer.startswith(b"HTTP/1.1 200 OK\r\n")
            assert answer.count(b"data: ") < 400
            assert not answer.split(b"\r\n\r\n", 1)[1].endswith(b"0\r\n\r\n")
        assert gated.gate.core.leases() == []

        # Nothing was left behind: the next request is served as usual.
        async with httpx.AsyncClient(timeout=60) as client:
            again = await client.post(
                f"http://127.0.0.1:{listen}/completion", json={"prompt": "b", "n_predict": 2}
            )
        assert again.status_code == 200 and again.json()["tokens_predicted"] == 2
