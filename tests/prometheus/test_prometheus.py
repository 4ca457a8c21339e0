"""A real Prometheus scrapes the gate; the alert rules pass promtool's checks and unit
tests; the Grafana dashboard asks only for metrics the gate exposes and documents."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import subprocess
from pathlib import Path

import aiohttp
import pytest

from gpugate.core.effects import EventKind
from tests.control.operated import operated_gate
from tests.gate.harness import running_stack
from tests.ports import free_port

ROOT = Path(__file__).resolve().parents[2]
PROM = ROOT / "build" / "prom" / "usr" / "bin"
PROMETHEUS = PROM / "prometheus"
PROMTOOL = PROM / "promtool"
DOCS = ROOT / "docs"
SHARE = ROOT / "gpugate" / "share"

SUFFIXES = ("_bucket", "_sum", "_count")

needs_prometheus = pytest.mark.skipif(
    not PROMETHEUS.exists(), reason="make test extracts Debian's prometheus first"
)


async def query(session: aiohttp.ClientSession, url: str, expr: str) -> list[dict]:
    async with session.get(url + "/api/v1/query", params={"query": expr}) as resp:
        body = await resp.json()
    assert body["status"] == "success", body
    return body["data"]["result"]


async def ready(session: aiohttp.ClientSession, url: str) -> bool:
    """Whether Prometheus answers its readiness endpoint with 200."""
    try:
        async with session.get(url + "/-/ready") as resp:
            await resp.read()
            return resp.status == 200
    except aiohttp.ClientConnectionError:
        return False


async def schedulable(session: aiohttp.ClientSession, control: str) -> int:
    async with session.get(control + "/gate/v1/status") as resp:
        return (await resp.json())["gpus"][0]["schedulable"]


@needs_prometheus
async def test_prometheus_scrapes_the_schedulable_bytes_the_status_reports(
    tmp_path, sim_host, fakenvml_path
):
    async with running_stack(tmp_path, sim_host, fakenvml_path) as stack:
        target = stack.control_url.removeprefix("http://")
        config = tmp_path / "prometheus.yml"
        config.write_text(
            "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
            "scrape_configs:\n"
            "  - job_name: gpugate\n"
            f"    static_configs: [{{targets: ['{target}']}}]\n"
        )
        port = free_port()
        process = await asyncio.create_subprocess_exec(
            str(PROMETHEUS),
            f"--config.file={config}",
            f"--storage.tsdb.path={tmp_path / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{port}",
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        url = f"http://127.0.0.1:{port}"
        try:
            async with aiohttp.ClientSession() as session:
                # Prometheus has no "scraped" notification: poll its API, as any client would.
                result: list[dict] = []
                async with asyncio.timeout(60):
                    # Its API answers 503 until it is ready (its TSDB opened).
                    while not await ready(session, url):
                        await asyncio.sleep(0.2)
                    while not result:
                        with contextlib.suppress(aiohttp.ClientConnectionError):
                            result = await query(
                                session, url, 'gpugate_budget_schedulable_bytes{gpu="0"}'
                            )
                        if not result:
                            await asyncio.sleep(0.2)
                scraped = int(float(result[0]["value"][1]))
                before = await schedulable(session, stack.control_url)
                after = await schedulable(session, stack.control_url)
                assert scraped in (before, after)
                assert result[0]["metric"]["job"] == "gpugate"
                (up,) = await query(session, url, 'up{job="gpugate"}')
                assert up["value"][1] == "1"
                # The simulated card: 16 GiB, 434 MiB reserved, nothing loaded, 1 GiB reserve.
                assert scraped == stack.gate.core.budget(0).schedulable
        finally:
            process.terminate()
            await process.wait()


@needs_prometheus
def test_the_alert_rules_pass_promtool_and_their_unit_tests():
    check = subprocess.run(
        [str(PROMTOOL), "check", "rules", str(SHARE / "alerts.yml")],
        capture_output=True,
        text=True,
        check=False,
    )
    assert check.returncode == 0, check.stdout + check.stderr
    assert "SUCCESS: 12 rules found" in check.stdout
    rules = (SHARE / "alerts.yml").read_text()
    names = set(re.findall(r"^\s+- alert: (\w+)", rules, re.M))
    assert {"GpugatePaused", "GpugateDown", "GpugateStoreDown", "GpugateUnhealthy"} <= names
    # Every metric a rule reads is one the gate documents (and so exports: tests/gate).
    documented = (DOCS / "metrics.md").read_text()
    for name in set(re.findall(r"\bgpugate_\w+", rules)):
        base = next((name.removesuffix(s) for s in SUFFIXES if name.endswith(s)), name)
        assert f"`{base}`" in documented, name
    tested = set(re.findall(r"alertname: (\w+)", (SHARE / "alerts.test.yml").read_text()))
    assert names == tested, names ^ tested
    unit = subprocess.run(
        [str(PROMTOOL), "test", "rules", "alerts.test.yml"],
        cwd=SHARE,
        capture_output=True,
        text=True,
        check=False,
    )
    assert unit.returncode == 0, unit.stdout + unit.stderr
    assert "SUCCESS" in unit.stdout


def exposed_names(text: str) -> set[str]:
    """Every series name the exposition can have, samples or not."""
    names = set()
    for kind_line in re.findall(r"^# TYPE (\S+) (\S+)$", text, re.M):
        name, kind = kind_line
        names.add(name)
        if kind == "histogram":
            names.update(name + s for s in SUFFIXES)
        if kind == "counter" and not name.endswith("_total"):
            names.add(name + "_total")
        if kind == "info":
            names.add(name + "_info")
    names.update(re.findall(r"^(gpugate_\w+)[{ ]", text, re.M))
    return names


async def test_the_grafana_dashboard_uses_only_exposed_and_documented_metrics(
    tmp_path, sim_host, fakenvml_path
):
    dashboard = json.loads((SHARE / "grafana-dashboard.json").read_text())
    expressions = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    expressions += [v["definition"] for v in dashboard["templating"]["list"] if v.get("definition")]
    used = {name for e in expressions for name in re.findall(r"\bgpugate_\w+", e)}
    assert len(used) >= 15
    async with (
        running_stack(tmp_path, sim_host, fakenvml_path) as stack,
        aiohttp.ClientSession() as session,
        session.get(stack.control_url + "/metrics") as resp,
    ):
        exposition = await resp.text()
    documented = (DOCS / "metrics.md").read_text()
    exposed = exposed_names(exposition)
    assert used <= exposed, used - exposed
    for name in used:
        base = next((name.removesuffix(s) for s in SUFFIXES if name.endswith(s)), name)
        assert f"`{base}`" in documented, name


@pytest.mark.skipif(not PROMTOOL.exists(), reason="make test extracts Debian's prometheus first")
async def test_the_exposition_passes_promtool_with_a_paused_gpu_and_a_draining_consumer(tmp_path):
    async with operated_gate(tmp_path) as op:
        await op.post("/gate/v1/gpus/0/pause")
        await op.post("/gate/v1/consumers/trainer/drain")
        queued = op.gate.events.next(lambda e: e.kind is EventKind.TICKET_QUEUED)
        ask = asyncio.ensure_future(
            op.post("/gate/v1/leases", {"consumer": "render", "bytes": "1GiB", "max_wait": 600})
        )
        await asyncio.wait_for(queued, 10)
        op.clock.now += 120
        text = await op.exposition()
        await op.post("/gate/v1/gpus/0/resume")
        status, _ = await asyncio.wait_for(ask, 10)
        assert status == 201
    lint = subprocess.run(
        [str(PROMTOOL), "check", "metrics"], input=text, capture_output=True, text=True, timeout=30
    )
    assert lint.returncode == 0, lint.stdout + lint.stderr
    for sample in (
        'gpugate_gpu_paused{gpu="0"} 1.0',
        'gpugate_gpu_paused_seconds{gpu="0"} 120.0',
        'gpugate_consumer_draining{consumer="trainer"} 1.0',
        'gpugate_consumer_draining{consumer="render"} 0.0',
        'gpugate_queue_tickets{class="production",gpu="0"} 0.0',
    ):
        assert sample in text.splitlines(), sample
