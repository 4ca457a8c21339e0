"""ComfyUI's own page, served through the gate and opened in headless Chromium: it passes
ComfyUI's origin check, opens its websocket through the gate, and shows live status as a
prompt queued from the page runs."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.dashboard.cdp import CHROMIUM, chromium_page
from tests.gate.comfyui_stack import comfy_stack

pytestmark = pytest.mark.skipif(
    shutil.which("chromium") is None and not Path(CHROMIUM).exists(),
    reason="make test installs chromium first",
)


@pytest.mark.parametrize("cors", [None, "*"], ids=["origin-check", "enable-cors-header"])
async def test_the_comfyui_page_through_the_gate_shows_live_status(
    tmp_path, sim_host, fakenvml_path, cors
):
    async with comfy_stack(tmp_path, sim_host, fakenvml_path, enable_cors_header=cors) as stack:
        url = stack.gate_comfy + "/"
        async with chromium_page(url, tmp_path / "profile") as page:
            # The socket opened through the gate: ComfyUI's first message set the queue.
            assert await page.wait_for(
                "document.getElementById('socket')?.textContent === 'open'"
                " && document.getElementById('queue')?.textContent === '0'"
            )
            await page.evaluate("document.getElementById('queue-button').click()")
            # The prompt's events reach the page over the relayed socket: its image shows.
            assert await page.wait_for(
                "document.querySelectorAll('#images img').length === 1"
                " && document.getElementById('log')?.textContent.includes('execution_success')"
            )
            src = await page.evaluate("document.querySelector('#images img').src")
            assert src.startswith(stack.gate_comfy + "/")
            assert await page.wait_for(
                "document.querySelector('#images img').complete"
                " && document.querySelector('#images img').naturalWidth === 64"
            )
        assert stack.gate.core.leases() == []
        assert stack.gate.core.waiting() == []
