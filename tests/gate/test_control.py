"""The control listener: /metrics (linted by promtool), /gate/v1/status, /gate/v1/events."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import aiohttp
import ollama
import pytest
from prometheus_client.parser import text_string_to_metric_families

PROMTOOL = Path(__file__).resolve().parents[2] / "build" / "prom" / "usr" / "bin" / "promtool"


async def fetch(url: str, headers: dict | None = None) -> tuple[int, str, str]:
    async with aiohttp.ClientSession() as session, session.get(url, headers=headers) as resp:
        return resp.status, resp.headers.get("Content-Type", ""), await resp.text()


def samples(text: str) -> dict[tuple[str, tuple], float]:
    out = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return out


async def test_metrics_carry_the_budget_rows_and_the_counters(stack):
    await ollama.AsyncClient(host=stack.gate_url).generate(
        model="llama3.2:3b", prompt="x", options={"num_predict": 1}
    )
    status, content_type, text = await fetch(stack.control_url + "/metrics")
    assert status == 200 and content_type.startswith("text/plain")
    values = samples(text)
    budget = stack.gate.core.budget(0)
    gpu = (("gpu", "0"),)
    assert values[("gpugate_gpu_memory_total_bytes", gpu)] == budget.total
    assert values[("gpugate_budget_reserve_bytes", gpu)] == budget.reserve
    assert values[("gpugate_budget_resident_bytes", (("consumer", "ollama"), ("gpu", "0")))] == (
        3200 * 1024**2
    )
    assert (
        values[("gpugate_leases_granted_total", (("class", "interactive"), ("consumer", "ollama")))]
        == 1
    )
    assert values[("gpugate_nvml_up", ())] == 1
    assert values[("gpugate_lease_wait_seconds_count", (("class", "interactive"),))] == 1


@pytest.mark.skipif(not PROMTOOL.exists(), reason="make test installs promtool first")
async def test_promtool_finds_nothing_to_lint(stack):
    await ollama.AsyncClient(host=stack.gate_url).embed(model="bge-m3", input="x")
    _, _, text = await fetch(stack.control_url + "/metrics")
    result = subprocess.run(
        [str(PROMTOOL), "check", "metrics"], input=text.encode(), capture_output=True, timeout=30
    )
    assert result.returncode == 0, result.stdout.decode() + result.stderr.decode()


async def test_openmetrics_is_served_when_asked(stack):
    _, content_type, text = await fetch(
        stack.control_url + "/metrics", {"Accept": "application/openmetrics-text"}
    )
    assert content_type.startswith("application/openmetrics-text")
    assert text.rstrip().endswith("# EOF")


async def test_status_document_is_the_gates_books(stack):
    await ollama.AsyncClient(host=stack.gate_url).generate(
        model="llama3.2:3b", prompt="x", options={"num_predict": 1}
    )
    status, _, text = await fetch(stack.control_url + "/gate/v1/status")
    document = json.loads(text)
    assert status == 200 and document["source"] == "gate"
    (gpu,) = document["gpus"]
    budget = stack.gate.core.budget(0)
    assert gpu["schedulable"] == budget.schedulable
    assert (
        gpu["total"]
        - gpu["driver_reserved"]
        - gpu["external_total"]
        - gpu["committed_total"]
        - gpu["reserve"]
        == gpu["schedulable"]
    )
    assert gpu["consumers"]["ollama"]["resident"] == 3200 * 1024**2
    (resident,) = document["residents"]
    assert resident["model"] == "llama3.2:3b" and resident["state"] == "resident"
    assert 890 < resident["expires_in_seconds"] <= 900
    assert document["leases"] == [] and document["queue"] == []


async def test_events_are_json_lines(stack):
    await ollama.AsyncClient(host=stack.gate_url).generate(
        model="llama3.2:3b", prompt="x", options={"num_predict": 1}
    )
    _, content_type, text = await fetch(stack.control_url + "/gate/v1/events")
    assert content_type.startswith("application/x-ndjson")
    kinds = [json.loads(line)["event"] for line in text.splitlines()]
    assert kinds[:2] == ["lease_granted", "lease_released"]


async def test_every_metric_is_in_the_manual_and_every_documented_one_exists(stack):
    import re

    _, _, text = await fetch(stack.control_url + "/metrics")
    served = {family.name for family in text_string_to_metric_families(text)}
    manual = (Path(__file__).resolve().parents[2] / "docs" / "metrics.md").read_text()
    documented = {
        re.sub(r"_total$", "", name)
        for name in re.findall(r"^\| `(gpugate_[a-z_]+)` \|", manual, re.MULTILINE)
    }
    assert served == documented
