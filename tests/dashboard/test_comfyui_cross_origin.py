"""A web page on another origin posts a prompt to ComfyUI's port, as any site a user visits
could: ComfyUI's origin check refuses it (403), and the gate refuses it before anything is
admitted, so the idle model another runtime holds is not evicted for it. In headless
Chromium, with a real cross-origin `fetch`."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web

from gpugate.core.effects import EventKind
from tests.dashboard.cdp import CHROMIUM, chromium_page
from tests.gate.comfyui_stack import comfy_stack
from tests.sim.comfyui_helpers import flux

pytestmark = pytest.mark.skipif(
    shutil.which("chromium") is None and not Path(CHROMIUM).exists(),
    reason="make test installs chromium first",
)

PAGE = """<!doctype html><title>elsewhere</title><pre id="out">sending</pre><script>
fetch(%(target)s, {method: "POST", mode: "no-cors", body: %(body)s})
  .then(r => { document.getElementById("out").textContent = "answered " + r.type; })
  .catch(e => { document.getElementById("out").textContent = "failed " + e; });
</script>"""


async def test_a_prompt_from_another_origin_evicts_nothing(tmp_path, sim_host, fakenvml_path):
    async with comfy_stack(tmp_path, sim_host, fakenvml_path) as stack:
        # An idle model another runtime holds: the incident's gemma3:12b.
        async with (
            aiohttp.ClientSession() as session,
            session.post(
                stack.gate_ollama + "/api/generate",
                json={"model": "gemma3:12b", "prompt": "hi", "stream": False},
                headers={"Host": "localhost:11434"},
            ) as resp,
        ):
            assert resp.status == 200, await resp.text()
        evictions = []
        stack.gate.events.subscribe(
            lambda e: evictions.append(e) if e.kind is EventKind.EVICTION_STARTED else None
        )
        body = json.dumps(json.dumps({"prompt": flux(), "client_id": "page"}))
        html = PAGE % {"target": json.dumps(stack.gate_comfy + "/prompt"), "body": body}

        async def page(request: web.Request) -> web.Response:
            return web.Response(text=html, content_type="text/html")

        app = web.Application()
        app.router.add_get("/", page)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = runner.addresses[0][1]
        try:
            async with chromium_page(f"http://127.0.0.1:{port}/", tmp_path / "profile") as tab:
                # An opaque answer: the browser sent the request; the gate answered it.
                assert await tab.wait_for(
                    "document.getElementById('out')?.textContent === 'answered opaque'"
                )
        finally:
            await runner.cleanup()
        assert evictions == []
        assert stack.gate.jobs.live("comfyui") == []
        assert [x for x in stack.gate.core.leases() if x.key.consumer == "comfyui"] == []
        assert stack.comfy.queue.get_history() == {}
        async with (
            aiohttp.ClientSession() as session,
            session.get(stack.gate_ollama + "/api/ps", headers={"Host": "localhost:11434"}) as resp,
        ):
            held = [m["name"] for m in (await resp.json())["models"]]
        assert held == ["gemma3:12b"]
