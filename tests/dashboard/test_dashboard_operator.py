"""The dashboard in headless Chromium shows what operators did (a PAUSED badge on the GPU,
DRAINING on the consumer, a summary in the header) until it is undone, and draws the
leased part of a consumer's bytes hatched."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.control.operated import operated_gate
from tests.dashboard.cdp import CHROMIUM, chromium_page

pytestmark = pytest.mark.skipif(
    shutil.which("chromium") is None and not Path(CHROMIUM).exists(),
    reason="make test installs chromium first",
)

PAUSED = "document.querySelector('#gpu-0 h3 [data-paused]')"
DRAINING = "document.querySelector('#gpu-0 .legend [data-name=trainer] [data-draining]')"
STYLE = """JSON.stringify([...document.querySelectorAll('#gpu-0 .seg.leased, #gpu-0 .sw.leased')]
    .map((x) => [getComputedStyle(x).backgroundImage, getComputedStyle(x).backgroundColor]))"""


async def test_pause_drain_badges_and_the_leased_hatch(tmp_path):
    async with operated_gate(tmp_path) as op:
        status, _ = await op.post("/gate/v1/leases", {"consumer": "trainer", "bytes": "2GiB"})
        assert status == 201
        (gpu,) = (await op.get("/gate/v1/status"))["gpus"]
        assert gpu["consumers"]["trainer"]["pending"] > 0
        await op.post("/gate/v1/gpus/0/pause")
        await op.post("/gate/v1/consumers/trainer/drain")
        op.clock.now += 125
        url = str(op.client.make_url("/"))
        async with chromium_page(url, tmp_path / "profile") as page:
            await page.wait_for(f"{PAUSED} && {DRAINING}")
            assert await page.evaluate(f"{PAUSED}.textContent") == "PAUSED 2m05s"
            title = await page.evaluate(f"{PAUSED}.title")
            assert title == "for 2m05s by token · undo: gpugate resume --gpu 0"
            assert await page.evaluate(f"{DRAINING}.textContent") == "DRAINING"
            assert await page.evaluate(f"{DRAINING}.title") == (
                "for 2m05s by token · undo: gpugate undrain trainer"
            )
            header = "document.getElementById('operator')"
            assert await page.evaluate(f"{header}.hidden") is False
            assert await page.evaluate(f"{header}.textContent") == (
                "GPU 0 paused · trainer draining"
            )
            # The bar's leased segment and its legend swatch: the hatch over the colour.
            styles = json.loads(await page.evaluate(STYLE))
            assert len(styles) == 2, styles
            for image, colour in styles:
                assert image.startswith("repeating-linear-gradient("), image
                assert colour not in ("", "rgba(0, 0, 0, 0)", "transparent"), colour

            await op.post("/gate/v1/gpus/0/resume")
            await op.post("/gate/v1/consumers/trainer/undrain")
            await page.wait_for(f"!{PAUSED} && !{DRAINING} && {header}.hidden")
            assert await page.evaluate(f"{header}.textContent") == ""
