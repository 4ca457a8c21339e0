"""The SQLite store: real files, migrations, and what survives a restart."""

from __future__ import annotations

import sqlite3

from gpugate.core.classes import PriorityClass
from gpugate.core.effects import Event, EventKind
from gpugate.core.failures import Failure, FailureClass
from gpugate.core.tickets import Lease
from gpugate.store.db import MIGRATIONS, MeasuredEnvelope, Store
from tests.core.builders import demand


async def test_a_new_file_is_migrated_and_records_survive_reopening(tmp_path):
    path = tmp_path / "state" / "gpugate.db"
    store = Store(path)
    await store.open()
    assert await store.schema_version() == len(MIGRATIONS)
    failure = Failure(FailureClass.QUEUE_FULL, "QUEUE_FULL: x", consumer="ollama", model="m")
    store.record_event(
        Event(
            EventKind.FAILURE,
            1.0,
            consumer="ollama",
            model="m",
            failure=failure,
            detail=failure.message,
        )
    )
    store.record_envelope(MeasuredEnvelope("ollama", "m:latest", "", 123))
    store.record_envelope(MeasuredEnvelope("ollama", "m:latest", "", 456))
    lease = Lease(
        7,
        demand("m:latest", 100, priority=PriorityClass.BACKGROUND),
        granted=0.0,
        waited=0.25,
        pending=0,
        loads=True,
    )
    store.record_lease(lease, 2.0, "done")
    await store.flush()
    await store.close()

    again = Store(path)
    await again.open()
    assert await again.envelopes() == [MeasuredEnvelope("ollama", "m:latest", "", 456)]
    await again.close()
    with sqlite3.connect(path) as db:
        rows = db.execute("SELECT id, priority, waited, held, outcome FROM leases").fetchall()
        events = db.execute("SELECT kind, consumer, failure_class FROM events").fetchall()
    assert rows == [(7, "background", 0.25, 2.0, "done")]
    assert events == [("failure", "ollama", "QUEUE_FULL")]


async def test_an_in_memory_store_needs_no_file(tmp_path):
    store = Store(None)
    await store.open()
    store.record_envelope(MeasuredEnvelope("c", "m", "num_ctx=4", 9))
    await store.flush()
    assert await store.envelopes() == [MeasuredEnvelope("c", "m", "num_ctx=4", 9)]
    await store.close()
    assert list(tmp_path.iterdir()) == []
