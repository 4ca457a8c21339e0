"""ComfyUI's origin check through the gate: a browser at the gate's address passes, over
HTTP and the /ws upgrade, whether ComfyUI runs its origin check or `--enable-cors-header`;
a mismatched origin gets what ComfyUI would have answered at that address."""

from __future__ import annotations

import aiohttp
import pytest

from tests.gate.comfyui_stack import comfy_stack


@pytest.fixture(params=[None, "*"], ids=["origin-check", "enable-cors-header"])
async def stack(request, tmp_path, sim_host, fakenvml_path):
    async with comfy_stack(
        tmp_path, sim_host, fakenvml_path, enable_cors_header=request.param
    ) as stack:
        yield stack, request.param


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
            via = resp.status, await resp.read()
        async with session.get(f"{stack.direct_comfy}/api/system_stats") as resp:
            direct = resp.status, await resp.read()
        assert via[0] == direct[0] == (200 if cors else 403)
        if not cors:
            assert via[1] == b""
            with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
                await session.ws_connect(f"{stack.gate_comfy}/ws?clientId=b2")
            assert refused.value.status == 403
