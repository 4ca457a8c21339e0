"""A prompt whose ceiling can never be had is granted its floor through the gate: ComfyUI
renders it with a partial load, and the answer, the `degraded` event and
`gpugate_degraded_grants_total` say so."""

from __future__ import annotations

import asyncio

import aiohttp

from gpugate.control.metrics import GateMetrics
from gpugate.core.classes import PriorityClass
from gpugate.core.effects import EventKind
from gpugate.core.explicit import LeaseTerms
from gpugate.core.failures import FailureClass
from gpugate.core.job_leases import JOBS_MODEL
from gpugate.core.units import MiB
from gpugate.gate.exchange import DEGRADED_HEADER, LEASE_HEADER
from tests.gate.comfyui_stack import comfy_stack
from tests.sim.comfyui_helpers import flux, txt2img


def degraded_counted(metrics: GateMetrics) -> dict[tuple[str, str], float]:
    return {
        (s.labels["consumer"], s.labels["gpu"]): s.value
        for f in metrics.degraded.collect()
        for s in f.samples
        if s.name == "gpugate_degraded_grants_total"
    }


async def test_a_prompt_whose_ceiling_can_never_be_had_renders_at_its_floor(
    tmp_path, sim_host, fakenvml_path
):
    async with comfy_stack(tmp_path, sim_host, fakenvml_path) as stack:
        gate = stack.gate
        metrics = GateMetrics(gate)
        # A script of the ComfyUI host's own holds 1.5 GiB under the consumer's explicit
        # lease, with no known end: the FLUX graph's 17 GiB can never be had beside it, the
        # most it could ever have (12.9 GiB) can. (Another consumer's lease not yet
        # allocated would make the prompt, which ComfyUI sizes to what it sees free, wait
        # for it instead: `gpugate.core.floors`.)
        held = await gate.leases.hold(
            LeaseTerms("comfyui", 0, 1536 * MiB, PriorityClass.PRODUCTION, ttl=600.0)
        )
        degraded = stack.next_event(EventKind.DEGRADED, consumer="comfyui")
        ended = stack.next_event(EventKind.LEASE_RELEASED, reason="jobs done")
        async with aiohttp.ClientSession() as session:
            async with session.post(f"{stack.gate_comfy}/prompt", json={"prompt": flux()}) as resp:
                answer = await resp.json(content_type=None)
                assert resp.status == 200, answer
                headers = resp.headers
            event = await asyncio.wait_for(degraded, 10)
            assert LEASE_HEADER in headers
            reason = FailureClass.INSUFFICIENT_SCHEDULABLE_VRAM.value
            assert headers[DEGRADED_HEADER] == (
                f"floor={event.bytes}; ceiling={event.ceiling}; reason={reason}"
            )
            assert event.reason == reason
            assert event.bytes is not None and event.ceiling is not None
            # The most it could ever have beside the held lease, above its floor: ComfyUI
            # loads the text encoders, then the UNet, and what does not fit stays in CPU RAM.
            assert 11350 * MiB < event.bytes < event.ceiling
            assert "could ever be freed for it" in event.detail
            assert "leases of comfyui with no known end 1.5 GiB" in event.detail
            [carrier] = [x for x in gate.core.leases() if x.key.model == JOBS_MODEL]
            assert carrier.pending == event.bytes
            await asyncio.wait_for(ended, 30)
            assert degraded_counted(metrics) == {("comfyui", "0"): 1.0}
            # A prompt that fits is granted whole, and says nothing of a floor.
            async with session.post(
                f"{stack.gate_comfy}/prompt", json={"prompt": txt2img()}
            ) as resp:
                assert resp.status == 200, await resp.text()
                assert DEGRADED_HEADER not in resp.headers
        gate.leases.release(held)
        assert sim_host.ooms() == []
