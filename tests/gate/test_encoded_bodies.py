"""An encoded body is read as the runtime's server reads it: aiohttp inflates, Go does not.

aiohttp's server undoes gzip and deflate (br and zstd where their libraries are there)
before ComfyUI's handler reads the body, so such a prompt runs like any other: the gate
must lease it as one, and what it cannot decode it refuses as aiohttp would.
"""

from __future__ import annotations

import gzip
import json
import sys
import zlib

import aiohttp
import pytest

from gpugate.core.job_leases import JOBS_MODEL
from gpugate.core.units import MiB
from gpugate.gate.exchange import LEASE_HEADER
from tests.gate.comfyui_stack import comfy_stack
from tests.gate.harness import running_stack
from tests.sim.comfyui_helpers import txt2img

if sys.version_info >= (3, 14):
    from compression import zstd
else:
    from backports import zstd


@pytest.fixture
async def stack(tmp_path, sim_host, fakenvml_path):
    async with comfy_stack(tmp_path, sim_host, fakenvml_path) as stack:
        yield stack


def encodings(body: bytes) -> list[tuple[str, bytes]]:
    raw_deflate = zlib.compressobj(wbits=-zlib.MAX_WBITS)
    return [
        ("gzip", gzip.compress(body)),
        ("GZIP", gzip.compress(body)),
        ("deflate", zlib.compress(body)),
        ("deflate", raw_deflate.compress(body) + raw_deflate.flush()),  # as aiohttp takes it
    ]


@pytest.mark.parametrize("index", range(4))
async def test_an_encoded_prompt_is_leased_like_any_other(stack, index):
    body = json.dumps({"prompt": txt2img(), "client_id": "c1"}).encode()
    coding, data = encodings(body)[index]
    async with (
        aiohttp.ClientSession(auto_decompress=False) as session,
        session.post(
            stack.gate_comfy + "/prompt",
            data=data,
            headers={"Content-Encoding": coding, "Content-Type": "application/json"},
        ) as resp,
    ):
        answer = await resp.json(content_type=None)
    assert resp.status == 200, answer
    assert LEASE_HEADER in resp.headers
    carriers = [x for x in stack.gate.core.leases() if x.key.model == JOBS_MODEL]
    assert [x.pending for x in carriers] == [2034 * MiB + 256 * MiB]
    assert stack.gate.jobs.live("comfyui")


async def test_an_undecodable_or_oversized_body_is_refused_before_any_lease(stack):
    body = json.dumps({"prompt": txt2img()}).encode()
    # 101 MiB once inflated, past ComfyUI's own limit of 100 MiB (its --max-upload-size).
    bomb = gzip.compress(b'{"prompt": "' + b"x" * (101 * 1024 * 1024) + b'"}')
    cases = [
        ("gzip", b"\x1f\x8bnot gzip at all", 500),
        ("br", body, 400),  # aiohttp without Brotli cannot decode it: 400, no handler
        ("gzip", bomb, 413),
    ]
    async with aiohttp.ClientSession(auto_decompress=False) as session:
        for coding, data, status in cases:
            async with session.post(
                stack.gate_comfy + "/prompt", data=data, headers={"Content-Encoding": coding}
            ) as resp:
                gated = await resp.read()
                assert resp.status == status, coding
                assert LEASE_HEADER not in resp.headers
        async with session.post(
            stack.direct_comfy + "/prompt", data=bomb, headers={"Content-Encoding": "gzip"}
        ) as resp:
            # The runtime's own words for a body past its limit, once inflated.
            assert (resp.status, await resp.read()) == (413, gated)
    assert [x for x in stack.gate.core.leases() if x.key.consumer == "comfyui"] == []
    assert stack.gate.jobs.live("comfyui") == []


async def test_an_encoded_ollama_body_is_read_as_go_reads_it_and_never_leased(
    tmp_path, sim_host, fakenvml_path
):
    """Go's net/http decodes no request body: Ollama reads gzip bytes as JSON and answers
    400 without loading, so the gate reads the same bytes and leases nothing."""
    body = json.dumps({"model": "llama3.2:3b", "prompt": "hi", "stream": False}).encode()
    async with (
        running_stack(tmp_path, sim_host, fakenvml_path) as stack,
        aiohttp.ClientSession(auto_decompress=False) as session,
    ):
        for coding, data in [("gzip", gzip.compress(body)), ("deflate", zlib.compress(body))]:
            gated = await post_raw(session, stack.gate_url, data, coding)
            direct = await post_raw(session, stack.sim_url, data, coding)
            assert gated == direct
            assert gated[0] == 400
        assert stack.gate.core.leases() == []
        assert await stack.ps() == []


async def post_raw(
    session: aiohttp.ClientSession, url: str, data: bytes, coding: str
) -> tuple[int, bytes, str | None]:
    async with session.post(
        url + "/api/generate",
        data=data,
        headers={"Content-Encoding": coding, "Host": "localhost:11434"},
    ) as resp:
        return resp.status, await resp.read(), resp.headers.get("X-GPUGate-Lease")


def _zstd(data: bytes, **options: int) -> bytes:
    """A zstd frame written as a stream (no size known up front: the window asked stays)."""
    params = {getattr(zstd.CompressionParameter, k): v for k, v in options.items()}
    compressor = zstd.ZstdCompressor(options=params or None)
    return compressor.compress(data, mode=zstd.ZstdCompressor.CONTINUE) + compressor.flush()


async def test_a_zstd_body_on_a_v1_route_is_inflated_as_ollama_does_and_leased(
    tmp_path, sim_host, fakenvml_path
):
    """cloudPassthroughMiddleware inflates `Content-Encoding: zstd` on the /v1 routes
    before anything reads the body: the gate reads, leases and sends what Ollama reads."""
    body = json.dumps(
        {"model": "llama3.2:3b", "messages": [{"role": "user", "content": "hi"}]}
    ).encode()
    async with (
        running_stack(tmp_path, sim_host, fakenvml_path) as stack,
        aiohttp.ClientSession(auto_decompress=False) as session,
    ):
        # Two frames, a skippable frame between them: one body to Ollama's reader.
        skippable = b"\x50\x2a\x4d\x18" + (4).to_bytes(4, "little") + b"skip"
        cut = len(body) // 2
        framed = _zstd(body[:cut]) + skippable + _zstd(body[cut:])
        async with session.post(
            stack.gate_url + "/v1/chat/completions",
            data=framed,
            headers={"Content-Encoding": "zstd", "Host": "localhost:11434"},
        ) as resp:
            answer = await resp.json()
        assert resp.status == 200, answer
        assert LEASE_HEADER in resp.headers
        assert [m["name"] for m in await stack.ps()] == ["llama3.2:3b"]


async def test_a_zstd_body_ollama_cannot_inflate_is_refused_before_any_lease(
    tmp_path, sim_host, fakenvml_path
):
    body = json.dumps({"model": "llama3.2:3b", "input": "hi"}).encode()
    cases = [
        (_zstd(body)[:-3], b'{"error":"unexpected EOF"}'),
        # A frame that asks for a 16 MiB window: past the 8 MiB Ollama's decoder may use.
        (_zstd(body, window_log=24), None),
        (b"\x28\xb5\x2f\xfd garbage", None),
    ]
    async with (
        running_stack(tmp_path, sim_host, fakenvml_path) as stack,
        aiohttp.ClientSession(auto_decompress=False) as session,
    ):
        for data, expected in cases:
            async with session.post(
                stack.gate_url + "/v1/embeddings",
                data=data,
                headers={"Content-Encoding": "zstd", "Host": "localhost:11434"},
            ) as resp:
                text = await resp.read()
                assert resp.status == 400, text
                assert LEASE_HEADER not in resp.headers
                assert json.loads(text)["error"]
                if expected is not None:
                    assert text == expected
        assert stack.gate.core.leases() == []
        assert await stack.ps() == []


async def test_comfyui_gets_no_zstd_even_where_the_gate_could_inflate_it(stack):
    body = json.dumps({"prompt": txt2img()}).encode()
    async with (
        aiohttp.ClientSession(auto_decompress=False) as session,
        session.post(
            stack.gate_comfy + "/prompt", data=_zstd(body), headers={"Content-Encoding": "zstd"}
        ) as resp,
    ):
        text = await resp.read()
    assert resp.status == 400
    assert text.startswith(b"Can not decode content-encoding: zstandard")
    assert stack.gate.jobs.live("comfyui") == []
