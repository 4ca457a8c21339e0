"""A body the gate reads is bounded by the runtime's own limit and refused in its words.

ComfyUI's aiohttp reads up to `--max-upload-size` (100 MB as it counts them); Ollama's Go
server and whisper-server's cpp-httplib read any body, so the gate keeps its own bound for
them. Past the limit the answer is the runtime's, before any lease and before anything
goes up. Bodies are generated as they are sent: nothing here holds one twice.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Mapping

import aiohttp
import pytest

from gpugate.config.model import DEFAULT_MAX_BODY
from gpugate.core.job_leases import JOBS_MODEL
from gpugate.core.units import MiB
from gpugate.gate.exchange import LEASE_HEADER
from gpugate.runtimes.comfyui.adapter import MAX_UPLOAD_SIZE
from tests.gate.comfyui_stack import comfy_stack
from tests.gate.test_process_start import stack_for
from tests.ports import free_ports
from tests.sim.comfyui_helpers import txt2img

CHUNK = 1 << 20
RELEVANT = ("Content-Type", "Content-Length", "Connection", "Access-Control-Allow-Origin")


@pytest.fixture
async def stack(tmp_path, sim_host, fakenvml_path):
    async with comfy_stack(tmp_path, sim_host, fakenvml_path) as stack:
        yield stack


async def padded(head: bytes, size: int) -> AsyncIterator[bytes]:
    """`head`, then JSON whitespace up to `size` bytes, a chunk at a time."""
    yield head
    block = b" " * CHUNK
    left = size - len(head)
    while left > 0:
        yield block[: min(left, CHUNK)]
        left -= CHUNK


async def post_padded(
    session: aiohttp.ClientSession, url: str, head: bytes, size: int, *, chunked: bool = False
) -> tuple[int, bytes, dict[str, str | None], Mapping[str, str]]:
    headers = {"Content-Type": "application/json"}
    if not chunked:
        headers["Content-Length"] = str(size)
    async with session.post(url, data=padded(head, size), headers=headers) as resp:
        shown = {name: resp.headers.get(name) for name in RELEVANT}
        return resp.status, await resp.read(), shown, resp.headers


async def headers_only(url: str, path: str, length: int, content_type: str) -> bytes:
    """A request whose head says `length` bytes follow, none of which are sent: an answer
    must come from the head alone."""
    host, port = url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        writer.write(
            f"POST {path} HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: {content_type}\r\n"
            f"Content-Length: {length}\r\n\r\n".encode()
        )
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
        size = next(
            int(line.split(b":", 1)[1])
            for line in head.split(b"\r\n")
            if line.lower().startswith(b"content-length:")
        )
        return head + await asyncio.wait_for(reader.readexactly(size), 10)
    finally:
        writer.close()


def comfy_leases(gate):
    return [x for x in gate.core.leases() if x.key.consumer == "comfyui"]


@pytest.mark.parametrize("chunked", [False, True], ids=["content-length", "chunked"])
async def test_a_prompt_past_comfyuis_limit_gets_its_own_413_from_the_gate(stack, chunked):
    head = json.dumps({"prompt": txt2img()}).encode()
    size = MAX_UPLOAD_SIZE + 1
    async with aiohttp.ClientSession() as session:
        gated = await post_padded(
            session, stack.gate_comfy + "/prompt", head, size, chunked=chunked
        )
        direct = await post_padded(
            session, stack.direct_comfy + "/prompt", head, size, chunked=chunked
        )
    assert gated[:3] == direct[:3]
    assert gated[0] == 413
    assert gated[1] == f"Maximum request body size {MAX_UPLOAD_SIZE} exceeded.".encode()
    assert LEASE_HEADER not in gated[3]
    assert comfy_leases(stack.gate) == [] and stack.gate.jobs.live("comfyui") == []


async def test_comfyuis_413_comes_from_the_head_alone_and_nothing_is_leased(stack):
    answer = await headers_only(
        stack.gate_comfy, "/prompt", MAX_UPLOAD_SIZE + 1, "application/json"
    )
    # Answered with none of the body sent: the gate has nothing it could have sent up.
    assert answer.startswith(b"HTTP/1.1 413 Request Entity Too Large\r\n")
    assert b"\r\nContent-Type: text/plain; charset=utf-8\r\n" in answer
    assert answer.endswith(f"Maximum request body size {MAX_UPLOAD_SIZE} exceeded.".encode())
    assert comfy_leases(stack.gate) == [] and stack.gate.core.waiting() == []
    assert stack.comfy.queue.tasks_remaining() == 0


async def test_a_prompt_between_the_gates_own_bound_and_comfyuis_limit_runs(stack):
    head = json.dumps({"prompt": txt2img(), "client_id": "c1"}).encode()
    size = 70 * 1000 * 1000
    assert DEFAULT_MAX_BODY < size < MAX_UPLOAD_SIZE
    async with aiohttp.ClientSession() as session:
        status, body, _, headers = await post_padded(
            session, stack.gate_comfy + "/prompt", head, size
        )
    assert status == 200, body[:200]
    assert LEASE_HEADER in headers
    assert json.loads(body)["prompt_id"]
    carriers = [x for x in stack.gate.core.leases() if x.key.model == JOBS_MODEL]
    assert [x.pending for x in carriers] == [2034 * MiB + 256 * MiB]


async def test_an_ollama_body_past_the_gates_own_bound_is_refused_in_ollamas_json(stack):
    answer = await headers_only(
        stack.gate_ollama, "/api/generate", DEFAULT_MAX_BODY + 1, "application/json"
    )
    assert answer.startswith(b"HTTP/1.1 413 ")
    assert b"\r\nContent-Type: application/json; charset=utf-8\r\n" in answer
    assert answer.endswith(b'{"error":"http: request body too large"}')
    assert [x for x in stack.gate.core.leases() if x.key.consumer == "ollama"] == []


async def test_a_whisper_load_past_the_gates_own_bound_is_answered_as_whisper_server_does(
    tmp_path, sim_host, fakenvml_path
):
    ports = free_ports(2)
    async with stack_for(tmp_path, sim_host, fakenvml_path, ports) as stack:
        answer = await headers_only(
            f"http://127.0.0.1:{ports[0]}",
            "/load",
            DEFAULT_MAX_BODY + 1,
            "multipart/form-data; boundary=x",
        )
        # cpp-httplib's 413 goes through whisper-server's error handler, which makes every
        # status but 400 and 500 a 404 naming the path.
        assert answer.startswith(b"HTTP/1.1 404 ")
        assert b"\r\nContent-Type: text/plain\r\n" in answer
        assert b"\r\nAccess-Control-Allow-Origin: *\r\n" in answer
        assert answer.endswith(b"File Not Found (/load)")
        # Refused before anything: no lease, and the stopped process was not started.
        assert [x for x in stack.gate.core.leases() if x.key.consumer == "whisper"] == []
        assert [r for r in stack.gate.core.residents() if r.key.consumer == "whisper"] == []


async def test_an_operators_max_body_wins_and_is_refused_in_the_runtimes_words(
    tmp_path, sim_host, fakenvml_path
):
    async with comfy_stack(tmp_path, sim_host, fakenvml_path, more="    max_body: 1KiB\n") as stack:
        head = json.dumps({"prompt": txt2img()}).encode()
        async with aiohttp.ClientSession() as session:
            status, body, shown, _ = await post_padded(
                session, stack.gate_comfy + "/prompt", head, 1025
            )
        assert (status, body) == (413, b"Maximum request body size 1024 exceeded.")
        assert shown["Content-Type"] == "text/plain; charset=utf-8"
        assert comfy_leases(stack.gate) == []
