"""The dashboard in headless Chromium: the incident host's bytes by service as
/gate/v1/status has them, and a load through the gate appearing without a reload."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import aiohttp
import ollama
import pytest
import yaml

from gpugate_sim.hostprocess import SimulatedHostProcess
from tests.dashboard.cdp import CHROMIUM, chromium_page
from tests.ports import free_ports

ROOT = Path(__file__).resolve().parents[2]
INCIDENT = ROOT / "gpugate_sim" / "data" / "incident-2026-07-10.yaml"
DEMO_CONFIG = ROOT / "gpugate_sim" / "data" / "demo-consumers.yaml"
SCREENSHOT = ROOT / "docs" / "dashboard.png"
UPDATE_ENV = "GPUGATE_UPDATE_SCREENSHOT"

pytestmark = pytest.mark.skipif(
    shutil.which("chromium") is None and not Path(CHROMIUM).exists(),
    reason="make test installs chromium first",
)


@pytest.fixture
def incident_gate(tmp_path):
    """The incident host (gpugate sim run) with `gpugate serve` in front, as `make run` has it."""
    spec = yaml.safe_load(INCIDENT.read_text())
    ollama_port, whisper_port, comfy_port, listen_port, control_port = free_ports(5)
    spec["ollama"]["listen"] = f"127.0.0.1:{ollama_port}"
    spec["whisper"]["listen"] = f"127.0.0.1:{whisper_port}"
    spec["comfyui"]["listen"] = f"127.0.0.1:{comfy_port}"
    for model in spec["ollama"]["models"]:
        model["load_seconds"] = "200ms"
    host_file = tmp_path / "incident.yaml"
    host_file.write_text(yaml.safe_dump(spec))
    config = tmp_path / "consumers.yaml"
    config.write_text(
        DEMO_CONFIG.read_text()
        .replace("127.0.0.1:9411", f"127.0.0.1:{control_port}")
        .replace("127.0.0.1:11434", f"127.0.0.1:{listen_port}")
        .replace("http://127.0.0.1:11435", f"http://127.0.0.1:{ollama_port}")
    )
    with SimulatedHostProcess(host_file, tmp_path / "state") as host:
        assert host.environment is not None
        gate = subprocess.Popen(
            [sys.executable, "-m", "gpugate", "serve", "--config", str(config)],
            env=host.environment.apply(dict(os.environ)),
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        try:
            assert gate.stdout is not None
            for line in gate.stdout:
                if line.startswith("gpugate: ready"):
                    break
            else:
                raise AssertionError("the gate did not start")
            yield f"http://127.0.0.1:{listen_port}", f"http://127.0.0.1:{control_port}"
        finally:
            gate.terminate()
            gate.wait(timeout=30)


LEGEND = """JSON.stringify([...document.querySelectorAll('#gpu-0 .legend .item')].map(
    (x) => [x.dataset.kind, x.dataset.name, Number(x.dataset.bytes)]))"""


RESIDENTS = "[...document.querySelectorAll('#residents tbody tr')].map((r) => r.dataset.model)"


def expected_legend(status: dict) -> list[list]:
    (gpu,) = status["gpus"]
    rows = [["driver", "driver reserved", gpu["driver_reserved"]]]
    rows += [["external", name, n] for name, n in gpu["external"].items()]
    for name, row in gpu["consumers"].items():
        leased = min(row["pending"], row["committed"])
        rows.append(["consumer", name, row["committed"] - leased])
        if leased:
            rows.append(["leased", name, leased])
    rows.append(["reserve", "reserve", gpu["reserve"]])
    rows.append(["free", "schedulable", gpu["schedulable"]])
    return rows


async def status_of(control: str) -> dict:
    async with aiohttp.ClientSession() as session, session.get(control + "/gate/v1/status") as r:
        return await r.json()


async def test_the_dashboard_shows_the_incident_and_a_load_without_a_reload(
    incident_gate, tmp_path
):
    gate_url, control = incident_gate
    async with chromium_page(control + "/", tmp_path / "profile") as page:
        await page.wait_for("document.querySelector('#gpu-0 .legend [data-kind=consumer]')")
        # The page and a status read may straddle a sample, or whisper-server's start
        # (always_warm) becoming its resident: poll until legend and residents both agree.
        async with asyncio.timeout(20):
            while True:
                status = await status_of(control)
                shown = json.loads(await page.evaluate(LEGEND))
                residents = await page.evaluate(RESIDENTS)
                if shown == expected_legend(status) and sorted(residents) == sorted(
                    r["model"] for r in status["residents"]
                ):
                    break
                await asyncio.sleep(0.2)
        by_name = {(k, n): b for k, n, b in shown}
        consumers = status["gpus"][0]["consumers"]
        # The incident: Ollama's two runners, whisper-server, mVoice and an idle ComfyUI.
        assert {n for k, n in by_name if k == "consumer"} == {
            "ollama",
            "whisper",
            "mvoice",
            "comfyui",
        }
        assert by_name[("consumer", "ollama")] == consumers["ollama"]["committed"]
        assert sum(b for _, _, b in shown) == status["gpus"][0]["total"]
        assert "qwen2.5:7b" not in residents

        client = ollama.AsyncClient(host=gate_url)
        answer = await client.generate("qwen2.5:7b", "hi", keep_alive="10m")
        assert answer.done
        await page.wait_for(
            "document.querySelector('#residents tbody tr[data-model=\"qwen2.5:7b\"]')"
        )
        await page.wait_for("document.querySelector('#events tr[data-event=eviction_started]')")
        status = await status_of(control)
        assert any(r["model"] == "qwen2.5:7b" for r in status["residents"])
        # whisper-server's start (always_warm) holds its lease until it answers, which on a
        # busy machine may come after the load above: wait for it, as an operator would.
        async with asyncio.timeout(30):
            while status["leases"] or status["queue"]:
                await asyncio.sleep(0.2)
                status = await status_of(control)

        await page.wait_for("document.querySelector('#leases tbody tr.empty')")
        shot = tmp_path / "dashboard.png"
        await page.screenshot(shot)
        assert shot.stat().st_size > 10_000
        if os.environ.get(UPDATE_ENV):
            SCREENSHOT.write_bytes(shot.read_bytes())
