"""A database that refuses writes never holds up admission, and catches up afterwards."""

from __future__ import annotations

import asyncio
import sqlite3

import aiohttp
import ollama
from prometheus_client.parser import text_string_to_metric_families

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
