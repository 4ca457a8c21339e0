"""A demand that waits is seen with what it waits for, while it waits: on
`GET /gate/v1/queue`, in the status document, in the capacity API (and so the agent) and in
`gpugate leases`. The case of the issue: two models that cannot be resident together, an
interactive one loaded and idle (kept warm), and a background request for the other, which
waits out the first one's idle ttl."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import aiohttp
import ollama
import pytest
from prometheus_client.parser import text_string_to_metric_families

from gpugate.commands.status import render_text
from gpugate.core.units import GiB
from gpugate.core.waits import WaitReason
from gpugate_sim.scenario import OllamaModelSpec
from tests.control.test_views_cli import gpugate
from tests.gate.harness import FAST, Stack, running_stack

BIG = 8 * GiB
MODELS = (
    OllamaModelSpec("chat:8b", BIG, **FAST),
    OllamaModelSpec("batch:8b", BIG, **FAST),
)
# Two 8 GiB models on a 16 GiB card (434 MiB driver reserved, 1 GiB reserve): one at a time.
MODELS_YAML = """\
chat:8b: {envelope: 8GiB, residency: {policy: keep_warm, ttl: 15m}}
batch:8b: {class: background, envelope: 8GiB}
"""
WAIT = 60.0
"""The most a state the test waits for may take (both cores busy)."""
KEEP_FOR_TTL = "queue:\n  yield_after: 1h\n"
"""chat:8b is kept for its whole ttl: with the default yield_after (15 s) the wait would end
while the test still looks at it, on a machine slow enough."""


@pytest.fixture
async def stack(tmp_path, sim_host, fakenvml_path) -> AsyncIterator[Stack]:
    async with running_stack(
        tmp_path,
        sim_host,
        fakenvml_path,
        models=MODELS,
        models_yaml=MODELS_YAML,
        extra=KEEP_FOR_TTL,
    ) as stack:
        yield stack


async def get(stack: Stack, path: str) -> tuple[int, dict]:
    async with aiohttp.ClientSession() as session, session.get(stack.control_url + path) as resp:
        return resp.status, await resp.json()


async def queued(stack: Stack) -> list[dict]:
    """The queue once it holds a demand (polled: the state is the gate's to reach)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + WAIT
    while loop.time() < deadline:
        status, document = await get(stack, "/gate/v1/queue")
        assert status == 200, document
        if document["queue"]:
            return document["queue"]
        await asyncio.sleep(0.05)
    raise AssertionError("no demand queued")


@contextlib.asynccontextmanager
async def waiting_request(stack: Stack) -> AsyncIterator[asyncio.Task]:
    """A background request for batch:8b while chat:8b (interactive) is loaded and idle;
    its client goes away at the end."""
    client = ollama.AsyncClient(host=stack.gate_url, timeout=600)
    await client.generate("chat:8b", "hello")
    task = asyncio.create_task(client.generate("batch:8b", "summarise the logs"))
    try:
        yield task
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await task


async def test_a_waiting_demand_is_seen_with_its_reason_while_it_waits(stack, tmp_path):
    async with waiting_request(stack) as task:
        (row,) = await queued(stack)
        assert (row["consumer"], row["model"], row["class"], row["gpu"], row["position"]) == (
            "ollama",
            "batch:8b",
            "background",
            0,
            0,
        )
        assert (row["reason"], row["hold"]) == ("holder_grace", "keep_warm"), row
        assert row["holder"] == {"consumer": "ollama", "model": "chat:8b", "options": ""}
        assert 0 < row["until_seconds"] <= 15 * 60
        assert row["short"] > 0 and row["waiting_seconds"] >= 0
        assert 0 < row["deadline_in_seconds"] <= 30 * 60
        assert "ollama/chat:8b" in row["line"] and "idle ttl" in row["line"]
        assert not task.done()

        # The status document (the dashboard's) and the capacity API have the same row.
        _, status = await get(stack, "/gate/v1/status")
        (same,) = status["queue"]
        assert (same["ticket"], same["reason"], same["line"][:40]) == (
            row["ticket"],
            row["reason"],
            row["line"][:40],
        )
        _, capacity = await get(stack, "/gate/v1/capacity")
        (card,) = capacity["gpus"]
        assert card["queue_depth"] == 1 and card["queued_bytes"] == BIG
        assert card["queue"][0]["reason"] == "holder_grace"
        assert "1 waiting demand" in capacity["agent"]["reason"]

        # The metric counts it by its reason, every other reason a 0.
        async with (
            aiohttp.ClientSession() as session,
            session.get(stack.control_url + "/metrics") as resp,
        ):
            exposition = await resp.text()
        samples = {
            s.labels["waits_for"]: s.value
            for family in text_string_to_metric_families(exposition)
            for s in family.samples
            if s.name == "gpugate_queue_waiting" and s.labels["gpu"] == "0"
        }
        assert samples["holder_grace"] == 1 and sum(samples.values()) == 1, samples
        assert len(samples) == len(WaitReason)
        # `gpugate status` names it with its reason; `gpugate leases` says it in full.
        assert "waiting: ollama/batch:8b (background, holder_grace)" in render_text(status)
        # `gpugate leases`: no lease in flight, and the waiting demand below.
        code, out, err = await gpugate(stack, tmp_path, "leases")
        assert code == 0, err
        lines = out.splitlines()
        assert lines[:3] == ["no lease in flight", "", "waiting:"], out
        assert lines[3].split()[:6] == [
            "TICKET", "CONSUMER", "MODEL", "GPU", "CLASS", "POS"
        ]  # fmt: skip
        cells = lines[4].split()
        assert cells[:6] == [str(row["ticket"]), "ollama", "batch:8b", "0", "background", "0"]
        assert "holder_grace:" in lines[4] and "ollama/chat:8b" in lines[4]
        assert not task.done()

    # Its client went away: nothing waits and nothing is held for it.
    loop = asyncio.get_running_loop()
    deadline = loop.time() + WAIT
    while stack.gate.core.waiting() and loop.time() < deadline:
        await asyncio.sleep(0.05)
    assert stack.gate.core.waiting() == []
    assert [lease for lease in stack.gate.core.leases() if lease.key.model == "batch:8b"] == []
    assert (await get(stack, "/gate/v1/queue"))[1] == {"queue": []}


async def test_the_queue_filters_by_gpu_and_consumer_and_refuses_unknown_ones(stack):
    async with waiting_request(stack):
        (row,) = await queued(stack)
        for path in ("/gate/v1/queue?gpu=0", "/gate/v1/queue?consumer=ollama"):
            status, document = await get(stack, path)
            assert status == 200 and [r["ticket"] for r in document["queue"]] == [row["ticket"]]
    for path, message in (
        ("/gate/v1/queue?gpu=7", "no GPU '7' (GPUs: 0)"),
        ("/gate/v1/queue?gpu=x", "no GPU 'x' (GPUs: 0)"),
        ("/gate/v1/queue?consumer=nosuch", "unknown consumer 'nosuch' (fronted: ollama)"),
    ):
        status, document = await get(stack, path)
        assert (status, document["error"]) == (400, {"class": "BAD_REQUEST", "message": message})
