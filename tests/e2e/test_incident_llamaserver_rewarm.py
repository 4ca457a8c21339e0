"""Warm again through llama-server's router: alpha and beta (background, `rewarm: true`),
evicted with `POST /models/unload` for the incident's FLUX render, are loaded again with
`POST /models/load` once ComfyUI frees its memory, with no request for them. The router
answers the load at once, so each rewarm's lease lasts until its listing says `loaded`.
The stack is test_incident_llamaserver's, its gate's models set to warm again."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import aiohttp
import pytest

from tests.clihost import running_gate, running_host
from tests.e2e.test_incident_comfyui import until_no_lease
from tests.e2e.test_incident_llamaserver import (
    WEIGHTS,
    Stack,
    router_status,
    sequence,
    stack,  # noqa: F401 (the fixture)
)

pytestmark = pytest.mark.e2e

WAIT = 60.0
"""Generous: both cores may be busy."""


async def test_the_models_evicted_for_the_render_are_loaded_again_by_the_router(
    stack: Stack,  # noqa: F811
    tmp_path: Path,
) -> None:
    text = stack.config.read_text()
    for name in WEIGHTS:
        text = text.replace(
            f"{name}: {{class: background,", f"{name}: {{class: background, rewarm: true,"
        )
    stack.config.write_text(text)
    assert text.count("rewarm: true") == len(WEIGHTS)
    with running_host(stack.host_file, tmp_path / "state", stack.ollama_port) as host:
        with running_gate(stack.config, host.env(), stack.gate_ollama, stack.control) as gate:
            async with aiohttp.ClientSession() as session:
                done = await sequence(session, stack.gated, client="after")
                assert done["type"] == "execution_success", done
                await until_no_lease(gate)
                listed = await router_status(session, stack.direct["llama"])
                # Evicted for the render, and not back while ComfyUI holds the card.
                assert {m: s["value"] for m, s in listed.items()} == {
                    m: "unloaded" for m in WEIGHTS
                }
                async with session.post(
                    stack.gated["comfyui"] + "/free", json={"free_memory": True}
                ) as resp:
                    assert resp.status == 200, await resp.text()
                deadline = time.monotonic() + WAIT
                while True:
                    listed = await router_status(session, stack.direct["llama"])
                    if all(listed[m]["value"] == "loaded" for m in WEIGHTS):
                        break
                    assert time.monotonic() < deadline, listed
                    await asyncio.sleep(0.1)
                status = await until_no_lease(gate)
                log = await gate.events()
        ooms = host.gpu.ooms()
    assert ooms == []
    rewarms = [e for e in log if str(e["event"]).startswith("rewarm_")]
    done_models = {e["model"] for e in rewarms if e["event"] == "rewarm_done"}
    assert done_models == set(WEIGHTS), rewarms
    assert all(e["consumer"] == "llama" for e in rewarms)
    assert status["leases"] == []
    residents = {(r["consumer"], r["model"]) for r in status["residents"]}
    assert {("llama", m) for m in WEIGHTS} <= residents
