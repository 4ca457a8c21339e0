"""Overrun through the gate: a load larger than its lease is noticed within one sample (an
`overrun` event and `gpugate_overruns_total`), and what NVML showed it holding is learned
as the model's measured size, which a smaller listing does not undo."""

from __future__ import annotations

import asyncio

import aiohttp
import ollama
from prometheus_client.parser import text_string_to_metric_families

from gpugate.core.effects import EventKind
from gpugate.core.residents import ResidentKey
from gpugate.core.units import MiB
from tests.gate.harness import running_stack

# The simulated llama3.2:3b takes 3,200 MiB; its configured envelope says 2,500 MiB.
SHORT_ENVELOPE = """\
gemma3:12b: {envelope: 7796MiB}
llama3.2:3b: {envelope: 2500MiB}
"""


async def overruns_counted(control_url: str) -> dict[tuple[str, str], float]:
    async with aiohttp.ClientSession() as session, session.get(control_url + "/metrics") as resp:
        text = await resp.text()
    counted = {}
    for family in text_string_to_metric_families(text):
        if family.name == "gpugate_overruns":
            for sample in family.samples:
                if sample.name == "gpugate_overruns_total":
                    counted[(sample.labels["consumer"], sample.labels["gpu"])] = sample.value
    return counted


async def test_a_load_larger_than_its_lease_is_an_overrun_counted_and_learned(
    tmp_path, sim_host, fakenvml_path
):
    async with running_stack(
        tmp_path, sim_host, fakenvml_path, models_yaml=SHORT_ENVELOPE
    ) as stack:
        noticed = stack.next_event(EventKind.OVERRUN, consumer="ollama")
        client = ollama.AsyncClient(host=stack.gate_url)
        await client.generate(model="llama3.2:3b", prompt="x", options={"num_predict": 1})
        event = await asyncio.wait_for(noticed, 30)
        assert event.gpu == 0
        assert event.bytes == 700 * MiB
        assert event.key is not None and event.key.model == "llama3.2:3b"
        assert "holds about 3.1 GiB where it was leased 2.4 GiB" in event.detail
        # Counted from that sample: committed is what NVML shows, not the lease.
        budget = stack.gate.core.budget(0)
        assert budget.consumer("ollama").committed >= 3200 * MiB
        assert await overruns_counted(stack.control_url) == {("ollama", "0"): 1.0}
        key = ResidentKey("ollama", "llama3.2:3b", event.key.options)
        assert stack.gate.envelopes.measured(key) == 3200 * MiB
        # A listing that names a smaller size leaves what NVML showed.
        stack.gate.envelopes.learn_listed(key, 3000 * MiB)
        assert stack.gate.envelopes.measured(key) == 3200 * MiB
        assert stack.host.ooms() == []
