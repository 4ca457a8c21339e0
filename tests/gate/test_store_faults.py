"""A database that refuses writes never holds up admission, and catches up afterwards."""

from __future__ import annotations

import asyncio
import json
import sqlite3

import aiohttp
import ollama
from prometheus_client.parser import text_string_to_metric_families

from gpugate.core.effects import Event, EventKind
from gpugate.store.db import CLOSE_TIMEOUT, RecordKind
from tests.gate.harness import running_stack


def scrape(text: str) -> dict[tuple[str, tuple], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


async def metrics(url: str) -> dict[tuple[str, tuple], float]:
    async with aiohttp.ClientSession() as session, session.get(url + "/metrics") as resp:
        return scrape(await resp.text())


def lease_rows(path) -> list[tuple[str, str]]:
    with sqlite3.connect(path) as db:
        return db.execute("SELECT model, outcome FROM leases ORDER BY rowid").fetchall()


async def test_requests_are_served_while_another_process_locks_the_database(
    tmp_path, sim_host, fakenvml_path
):
    async with running_stack(tmp_path, sim_host, fakenvml_path, database=True) as stack:
        path = stack.config.gate.database
        client = ollama.AsyncClient(host=stack.gate_url)
        other = sqlite3.connect(path, isolation_level=None)
        other.execute("BEGIN EXCLUSIVE")
        try:
            for model in ("llama3.2:3b", "bge-m3", "llama3.2:3b"):
                if model == "bge-m3":
                    await client.embed(model=model, input="x")
                else:
                    await client.generate(model=model, prompt="x", options={"num_predict": 1})
            assert await stack.gate.store.write_now() is False
            blocked = await metrics(stack.control_url)
        finally:
            other.execute("COMMIT")
            other.close()
        assert stack.gate.core.leases() == []
        assert blocked[("gpugate_store_up", ())] == 0
        assert blocked[("gpugate_store_buffered_records", ())] >= 3
        assert blocked[("gpugate_store_write_failures_total", ())] >= 1

        await stack.gate.store.flush()
        # The two loads have rows of their own; the third request, served at once by the
        # resident llama3.2:3b, is counted in its minute's row.
        assert lease_rows(path) == [("llama3.2:3b", "done"), ("bge-m3:latest", "done")]
        with sqlite3.connect(path) as db:
            minutes = db.execute("SELECT model, leases, outcome FROM lease_minutes").fetchall()
        assert minutes == [("llama3.2:3b", 1, "done")]
        after = await metrics(stack.control_url)
        assert after[("gpugate_store_up", ())] == 1
        assert after[("gpugate_store_buffered_records", ())] == 0
        assert {
            labels: value
            for (name, labels), value in after.items()
            if name == "gpugate_store_dropped_total"
        } == {(("kind", k.value),): 0 for k in RecordKind}


async def test_the_gate_stops_promptly_while_the_database_is_locked(
    tmp_path, sim_host, fakenvml_path
):
    loop = asyncio.get_running_loop()
    other = None
    try:
        async with running_stack(tmp_path, sim_host, fakenvml_path, database=True) as stack:
            other = sqlite3.connect(stack.config.gate.database, isolation_level=None)
            other.execute("BEGIN EXCLUSIVE")
            await ollama.AsyncClient(host=stack.gate_url).generate(
                model="llama3.2:3b", prompt="x", options={"num_predict": 1}
            )
            store = stack.gate.store
            stopping = loop.time()
        stopped = loop.time() - stopping
    finally:
        if other is not None:
            other.execute("COMMIT")
            other.close()
    assert stopped < CLOSE_TIMEOUT + 2
    assert store.buffered == 0 and store.dropped[RecordKind.LEASE] == 1
    assert lease_rows(stack.config.gate.database) == []


async def health(url: str) -> tuple[int, dict]:
    async with aiohttp.ClientSession() as session, session.get(url + "/gate/v1/health") as resp:
        return resp.status, await resp.json()


async def test_a_database_that_cannot_be_opened_leaves_the_gate_serving_with_the_store_down(
    tmp_path, sim_host, fakenvml_path
):
    # A directory where the file should be: SQLite cannot open it, even as root.
    blocker = tmp_path / "gpugate.db"
    blocker.mkdir()
    async with running_stack(tmp_path, sim_host, fakenvml_path, database=True) as stack:
        client = ollama.AsyncClient(host=stack.gate_url)
        await client.generate(model="llama3.2:3b", prompt="x", options={"num_predict": 1})
        down = await metrics(stack.control_url)
        assert down[("gpugate_store_up", ())] == 0
        assert down[("gpugate_store_write_failures_total", ())] >= 1
        status, document = await health(stack.control_url)
        (check,) = [c for c in document["checks"] if c["check"] == "store"]
        assert status == 503 and "store" in document["failed"]
        assert not check["ok"] and check["error"].startswith("cannot open")

        blocker.rmdir()
        await asyncio.wait_for(stack.gate.store.flush(), 10)
        assert lease_rows(blocker) == [("llama3.2:3b", "done")]
        assert (await metrics(stack.control_url))[("gpugate_store_up", ())] == 1
        status, document = await health(stack.control_url)
        assert status == 200, document


async def test_a_lone_surrogate_in_an_event_neither_stops_the_writer_nor_the_gate(
    tmp_path, sim_host, fakenvml_path
):
    async with running_stack(tmp_path, sim_host, fakenvml_path, database=True) as stack:
        path = stack.config.gate.database
        # A model name as a client can send it: JSON's "\ud800" is a lone surrogate.
        model = json.loads('"llama3.2:3b\\ud800"')
        stack.gate.store.record_event(Event(EventKind.FAILURE, 0.0, model=model, detail=model))
        await ollama.AsyncClient(host=stack.gate_url).generate(
            model="llama3.2:3b", prompt="x", options={"num_predict": 1}
        )
        await asyncio.wait_for(stack.gate.store.flush(), 5)
        assert stack.gate.store.healthy
        with sqlite3.connect(path) as db:
            models = [row[0] for row in db.execute("SELECT model FROM events")]
        assert "llama3.2:3b\\ud800" in models
        assert ("llama3.2:3b", "done") in lease_rows(path)
        store = stack.gate.store
    assert store.buffered == 0 and set(store.dropped.values()) == {0}
