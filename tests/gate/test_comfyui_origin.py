"""ComfyUI's origin check through the gate: a browser at the gate's address passes, over
HTTP and the /ws upgrade, whether ComfyUI runs its origin check or `--enable-cors-header`
(the consumer's `cors_header`); a mismatched origin gets what ComfyUI at the gate's address
would have answered, from the gate, before anything is admitted."""

from __future__ import annotations

import aiohttp
import pytest

from gpugate.gate.exchange import FAILURE_HEADER
from tests.gate.comfyui_stack import comfy_stack
from tests.sim.comfyui_helpers import flux, txt2img

CORS = {
    "Access-Control-Allow-Origin": "*",
    "Access-Control-Allow-Methods": "POST, GET, DELETE, PUT, OPTIONS",
    "Access-Control-Allow-Headers": "Content-Type, Authorization",
    "Access-Control-Allow-Credentials": "true",
}


@pytest.fixture(params=[None, "*"], ids=["origin-check", "enable-cors-header"])
async def stack(request, tmp_path, sim_host, fakenvml_path):
    more = "" if request.param is None else f'    cors_header: "{request.param}"\n'
    async with comfy_stack(
        tmp_path, sim_host, fakenvml_path, enable_cors_header=request.param, more=more
    ) as stack:
        yield stack, request.param


@pytest.fixture
async def checking(tmp_path, sim_host, fakenvml_path):
    async with comfy_stack(tmp_path, sim_host, fakenvml_path) as stack:
        yield stack


@pytest.fixture
async def with_cors(tmp_path, sim_host, fakenvml_path):
    more = '    cors_header: "*"\n'
    async with comfy_stack(
        tmp_path, sim_host, fakenvml_path, enable_cors_header="*", more=more
    ) as stack:
        yield stack


def cors_of(headers) -> dict[str, str]:
    return {name: headers[name] for name in CORS if name in headers}


async def test_a_browser_at_the_gates_address_passes(stack):
    stack, _ = stack
    origin = stack.gate_comfy
    async with aiohttp.ClientSession(headers={"Origin": origin}) as session:
        async with session.get(f"{stack.gate_comfy}/api/system_stats") as resp:
            assert resp.status == 200
        async with session.ws_connect(f"{stack.gate_comfy}/ws?clientId=b1") as ws:
            first = await ws.receive_json(timeout=10)
            assert first["type"] == "status" and first["data"]["sid"] == "b1"


async def test_a_mismatched_origin_is_answered_as_comfyui_would(stack):
    stack, cors = stack
    headers = {"Origin": "http://evil.example:8188"}
    async with aiohttp.ClientSession(headers=headers) as session:
        async with session.get(f"{stack.gate_comfy}/api/system_stats") as resp:
            via = resp.status, await resp.read(), cors_of(resp.headers)
        async with session.get(f"{stack.direct_comfy}/api/system_stats") as resp:
            direct = resp.status, await resp.read(), cors_of(resp.headers)
        assert via[0] == direct[0] == (200 if cors else 403)
        assert via[2] == direct[2] == (CORS if cors else {})
        if not cors:
            assert via[1] == b""
            with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
                await session.ws_connect(f"{stack.gate_comfy}/ws?clientId=b2")
            assert refused.value.status == 403


@pytest.mark.parametrize("hidden", [False, True], ids=["foreign", "upstream-address"])
async def test_a_refused_prompt_is_refused_at_the_gate_and_nothing_is_admitted(checking, hidden):
    stack = checking
    # The upstream's own address as Origin: the upstream, which sees the gate's Host (its
    # own address), would let it through; ComfyUI at the gate's address does not.
    origin = stack.direct_comfy if hidden else "http://evil.example:8188"
    async with aiohttp.ClientSession(headers={"Origin": origin}) as session:
        async with session.post(f"{stack.gate_comfy}/prompt", json={"prompt": flux()}) as resp:
            assert (resp.status, await resp.read()) == (403, b"")
            assert "Content-Type" not in resp.headers
        async with session.options(f"{stack.gate_comfy}/prompt") as resp:
            assert (resp.status, await resp.read()) == (403, b"")
    assert stack.gate.core.leases() == [] and stack.gate.core.waiting() == []
    async with aiohttp.ClientSession() as session:
        async with session.get(f"{stack.direct_comfy}/history") as resp:
            assert await resp.json() == {}
        async with session.get(f"{stack.direct_comfy}/queue") as resp:
            queue = await resp.json()
            assert queue["queue_running"] == [] and queue["queue_pending"] == []


async def test_with_cors_header_a_page_elsewhere_reads_the_gates_answers(with_cors):
    stack = with_cors
    headers = {"Origin": "http://page.example", "Access-Control-Request-Method": "POST"}
    async with aiohttp.ClientSession(headers=headers) as session:
        async with session.options(f"{stack.gate_comfy}/prompt") as resp:
            via = resp.status, await resp.read(), cors_of(resp.headers)
        async with session.options(f"{stack.direct_comfy}/prompt") as resp:
            direct = resp.status, await resp.read(), cors_of(resp.headers)
        assert via == direct == (200, b"", CORS)
        # A prompt the card cannot hold: the gate's own 503 carries ComfyUI's CORS headers.
        huge = flux()
        huge["6"]["inputs"].update(width=16384, height=16384)
        async with session.post(f"{stack.gate_comfy}/prompt", json={"prompt": huge}) as resp:
            assert resp.status == 503
            assert resp.headers[FAILURE_HEADER] == "INSUFFICIENT_SCHEDULABLE_VRAM"
            assert cors_of(resp.headers) == CORS
        # A prompt that runs: the runtime's own answer carries them once, not twice.
        async with session.post(f"{stack.gate_comfy}/prompt", json={"prompt": txt2img()}) as resp:
            assert resp.status == 200
            for name, value in CORS.items():
                assert resp.headers.getall(name) == [value]
