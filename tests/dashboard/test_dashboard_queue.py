"""The dashboard in headless Chromium shows a demand that waits with what it waits for, in
one line, while it waits; each refusal with its reason in one line; and why the reserve is
what it is. The waiting demand is the issue's case (tests/control/test_queue_view.py): a
background request for one 8 GiB model while an interactive one, kept warm, holds the card."""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import AsyncIterator
from pathlib import Path

import ollama
import pytest

from tests.control.test_queue_view import (
    KEEP_FOR_TTL,
    MODELS,
    MODELS_YAML,
    queued,
    waiting_request,
)
from tests.dashboard.cdp import CHROMIUM, chromium_page
from tests.gate.harness import Stack, running_stack

pytestmark = pytest.mark.skipif(
    shutil.which("chromium") is None and not Path(CHROMIUM).exists(),
    reason="make test installs chromium first",
)

ROW = "document.querySelector('#queue tbody tr[data-reason]')"
REFUSED = "document.querySelector('#refusals tbody tr[data-failure]')"
RESERVE = "document.querySelector('#gpu-0 .reserve-why')"
WAIT = 60.0


@pytest.fixture
async def stack(tmp_path, sim_host, fakenvml_path) -> AsyncIterator[Stack]:
    # A third model larger than the card: its request is refused at once.
    models_yaml = MODELS_YAML + "huge:70b: {envelope: 40GiB}\n"
    async with running_stack(
        tmp_path,
        sim_host,
        fakenvml_path,
        models=MODELS,
        models_yaml=models_yaml,
        extra=KEEP_FOR_TTL,
    ) as stack:
        yield stack


async def test_the_dashboard_shows_each_wait_and_refusal_in_one_line(stack, tmp_path):
    async with (
        chromium_page(stack.control_url + "/", tmp_path / "profile") as page,
        waiting_request(stack) as task,
    ):
        (row,) = await queued(stack)
        await page.wait_for(ROW, WAIT)
        cells = await page.evaluate(f"[...{ROW}.cells].map((c) => c.textContent)")
        assert cells[:5] == ["ollama", "batch:8b", "background", "0", "0"], cells
        assert await page.evaluate(f"{ROW}.dataset.ticket") == str(row["ticket"])
        assert await page.evaluate(f"{ROW}.dataset.reason") == "holder_grace"
        line = cells[-1]
        assert "ollama/chat:8b" in line and "idle ttl" in line, line
        assert await page.evaluate(f"{ROW}.cells[{len(cells) - 1}].title") == "holder_grace"
        assert not task.done()

        with pytest.raises(ollama.ResponseError) as refused:
            await ollama.AsyncClient(host=stack.gate_url).generate("huge:70b", "hi")
        assert refused.value.status_code == 503
        await page.wait_for(REFUSED, WAIT)
        assert await page.evaluate(f"{REFUSED}.dataset.failure") == (
            "INSUFFICIENT_SCHEDULABLE_VRAM"
        )
        why = await page.evaluate(f"{REFUSED}.cells[3].textContent")
        assert why.startswith("INSUFFICIENT_SCHEDULABLE_VRAM: huge:70b needs 40.0 GiB, ")
        assert why.endswith(": more than could ever be freed for it"), why
        message = await page.evaluate(f"{REFUSED}.cells[3].title")
        assert message.startswith("INSUFFICIENT_SCHEDULABLE_VRAM") and len(message) > len(why)

        reserve = await page.evaluate(f"{RESERVE}.textContent")
        assert reserve.startswith("reserve 1.00 GiB: base 1.0 GiB"), reserve

    # Its client gone, its ticket leaves the queue and nothing is held for it.
    loop = asyncio.get_running_loop()
    deadline = loop.time() + WAIT
    while stack.gate.core.waiting() and loop.time() < deadline:
        await asyncio.sleep(0.05)
    assert stack.gate.core.waiting() == []
    assert [lease for lease in stack.gate.core.leases() if lease.key.model == "batch:8b"] == []
