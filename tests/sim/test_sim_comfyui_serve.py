"""`gpugate sim run` with the incident card starts the simulated ComfyUI as one process."""

from __future__ import annotations

import json
from pathlib import Path

import aiohttp

from gpugate.core.units import MiB
from gpugate_sim.device import SimulatedGpuHost
from gpugate_sim.hostprocess import SimulatedHostProcess
from tests.faults.records import read_prompt_records
from tests.sim.comfyui_helpers import connect, flux, kinds, queue

INCIDENT = Path(__file__).resolve().parents[2] / "gpugate_sim/data/incident-2026-07-10.yaml"


async def test_sim_run_incident_serves_comfyui_as_one_process(tmp_path: Path):
    # The card as in the incident, on ports nobody else uses.
    text = INCIDENT.read_text().replace("127.0.0.1:8189", "127.0.0.1:0")
    # With a record of the prompts it answers, next to the host file.
    text = text.replace("\ncomfyui:\n", "\ncomfyui:\n  record: prompts.jsonl\n", 1)
    host_file = tmp_path / "host.yaml"
    host_file.write_text(text.replace("127.0.0.1:11435", "127.0.0.1:0"))
    with SimulatedHostProcess(host_file, tmp_path / "state") as host:
        assert host.ready_line is not None
        url = host.ready_line.split("comfyui at ")[1].strip()
        async with aiohttp.ClientSession() as session:
            async with session.get(f"{url}/models/diffusion_models") as resp:
                assert await resp.json() == ["flux1-dev-fp8.safetensors"]
            async with session.get(f"{url}/api/models/checkpoints") as resp:
                assert await resp.json() == ["v1-5-pruned-emaonly-fp16.safetensors"]
            gpu = SimulatedGpuHost(tmp_path / "state")
            port = url.rsplit(":", 1)[1]
            [row] = [p for p in gpu.read().processes if p.used == 210 * MiB]
            cmdline = Path(f"/proc/{row.pid}/cmdline").read_bytes().split(b"\0")
            assert [w.decode() for w in cmdline if w] == [
                "python3", "ComfyUI/main.py", "--listen", "127.0.0.1", "--port", port,
            ]  # fmt: skip
            assert Path(f"/proc/{row.pid}/comm").read_text().strip() == "python3"
            # 3,451 MiB (the two runners hold what their llama-servers hold for them).
            assert 3450 * MiB < gpu.free(0) <= 3451 * MiB
            # FLUX does not fit next to the Ollama runners: ComfyUI loads what fits beside
            # its working set and reserve, keeps the rest in CPU RAM, and renders.
            socket = await connect(session, url, "me")
            prompt_id = await queue(session, url + "/api", flux(), client_id="me")
            [record] = read_prompt_records(tmp_path / "prompts.jsonl")
            assert (record.status, record.queued, record.prompt_id) == (200, True, prompt_id)
            events = await socket.until_done(prompt_id)
            assert "execution_error" not in kinds(events)
            assert "execution_success" in kinds(events)
            assert gpu.ooms() == []
            # Less than the 11,350 MiB UNet alone: only part of the model is on the card.
            assert 210 * MiB < gpu.read().held_by(row.pid, 0) < 3451 * MiB
            async with session.get(f"{url}/system_stats") as resp:
                stats = json.loads(await resp.text())
            assert stats["devices"][0]["vram_free"] == gpu.free(0)
