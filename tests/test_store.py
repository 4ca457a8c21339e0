"""The SQLite store: real files, migrations, and what survives a restart."""

from __future__ import annotations

import asyncio
import sqlite3
import time

import attrs

from gpugate.core.classes import PriorityClass
from gpugate.core.effects import Event, EventKind
from gpugate.core.failures import Failure, FailureClass
from gpugate.core.tickets import Lease
from gpugate.store import db as store_db
from gpugate.store.db import MIGRATIONS, MeasuredEnvelope, RecordKind, Store
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


def failure_event(n: int, detail: str = "") -> Event:
    failure = Failure(FailureClass.QUEUE_FULL, f"QUEUE_FULL: {n}", consumer="ollama", model="m")
    return Event(
        EventKind.FAILURE,
        float(n),
        consumer="ollama",
        model=f"m{n}",
        failure=failure,
        detail=detail,
    )


class Locker:
    """Another process's connection holding a write transaction on the same file."""

    def __init__(self, path) -> None:
        self.db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)

    def __enter__(self) -> Locker:
        self.db.execute("BEGIN EXCLUSIVE")
        return self

    def __exit__(self, *exc: object) -> None:
        self.db.execute("COMMIT")
        self.db.close()


def models_in(path) -> list[str]:
    with sqlite3.connect(path) as db:
        return [row[0] for row in db.execute("SELECT model FROM events ORDER BY id")]


async def test_a_locked_file_keeps_records_and_writes_them_once_released(tmp_path, caplog):
    path = tmp_path / "gpugate.db"
    store = Store(path, busy_timeout=0.2)
    await store.open()
    with Locker(path):
        store.record_event(failure_event(1))
        store.record_envelope(MeasuredEnvelope("ollama", "m:latest", "", 123))
        assert await store.write_now() is False
        store.record_event(failure_event(2))
        assert await store.write_now() is False
        assert (store.buffered, store.write_failures) == (3, 2)
        assert store.last_error == "database is locked" and not store.healthy
    await store.flush()

    assert models_in(path) == ["m1", "m2"]
    assert await store.envelopes() == [MeasuredEnvelope("ollama", "m:latest", "", 123)]
    assert store.healthy and store.buffered == 0
    assert set(store.dropped.values()) == {0}
    warnings = [r for r in caplog.records if r.name == "gpugate.store" and r.levelname == "WARNING"]
    assert len(warnings) == 1 and "database is locked" in warnings[0].getMessage()
    await store.close()


async def test_a_full_buffer_drops_the_oldest_records_and_counts_them(tmp_path):
    path = tmp_path / "gpugate.db"
    store = Store(path, limit=3, busy_timeout=0.1)
    await store.open()
    with Locker(path):
        for n in range(1, 4):
            store.record_event(failure_event(n))
        assert await store.write_now() is False
        for n in range(4, 6):
            store.record_event(failure_event(n))
        assert store.buffered == 3
    await store.flush()

    assert models_in(path) == ["m3", "m4", "m5"]
    assert store.dropped == {
        RecordKind.EVENT: 2,
        RecordKind.LEASE: 0,
        RecordKind.LEASE_MINUTE: 0,
        RecordKind.ENVELOPE: 0,
        RecordKind.HISTORY: 0,
    }
    await store.close()


async def test_a_full_disk_keeps_records_until_there_is_room_again(tmp_path):
    path = tmp_path / "gpugate.db"
    store = Store(path)
    await store.open()
    store.record_event(failure_event(0))
    await store.flush()
    pages = await store.page_count()
    assert await store.set_max_page_count(pages) == pages
    for n in range(1, 41):
        store.record_event(failure_event(n, detail="x" * 2000))

    assert await store.write_now() is False
    assert store.last_error == "database or disk is full"
    assert store.buffered == 40
    assert models_in(path) == ["m0"]

    await store.set_max_page_count(pages * 100)
    await store.flush()
    assert models_in(path) == [f"m{n}" for n in range(41)]
    assert store.healthy and set(store.dropped.values()) == {0}
    await store.close()


async def test_close_does_not_hang_on_a_locked_file(tmp_path):
    path = tmp_path / "gpugate.db"
    store = Store(path, busy_timeout=0.2)
    await store.open()
    with Locker(path):
        store.record_event(failure_event(1))
        store.record_lease(
            Lease(7, demand("m", 100), granted=0.0, waited=0.0, pending=0, loads=True), 1.0, "done"
        )
        await asyncio.wait_for(store.close(), 3.0)

    assert store.dropped == {
        RecordKind.EVENT: 1,
        RecordKind.LEASE: 1,
        RecordKind.LEASE_MINUTE: 0,
        RecordKind.ENVELOPE: 0,
        RecordKind.HISTORY: 0,
    }
    assert models_in(path) == []


async def test_a_lease_row_is_built_when_written_from_what_was_recorded(tmp_path):
    path = tmp_path / "gpugate.db"
    store = Store(path)
    await store.open()
    lease = Lease(
        9,
        demand("m:latest", 100, options="num_ctx=4", priority=PriorityClass.PRODUCTION),
        granted=5.0,
        waited=0.5,
        pending=0,
        loads=False,
    )
    before = time.time()
    store.record_lease(lease, 1.5, "failed")
    after = time.time()
    assert store.buffered == 1
    await store.flush()
    await store.close()

    with sqlite3.connect(path) as db:
        (row,) = db.execute(
            "SELECT id, consumer, model, options, gpu, priority, bytes, loaded, waited, held,"
            " outcome, started FROM leases"
        ).fetchall()
    assert row[:-1] == (9, "ollama", "m:latest", "num_ctx=4", 0, "production", 100, 0, 0.5, 1.5,
                        "failed")  # fmt: skip
    # Started: when it was recorded, less how long it was held.
    assert before - 1.5 <= row[-1] <= after - 1.5


async def test_leases_kept_while_the_file_is_locked_are_dropped_oldest_first(tmp_path):
    path = tmp_path / "gpugate.db"
    store = Store(path, limit=3, busy_timeout=0.1)
    await store.open()
    leases = [
        Lease(n, demand(f"m{n}", 100), granted=0.0, waited=0.0, pending=0, loads=True)
        for n in range(1, 4)
    ]
    with Locker(path):
        store.record_lease(leases[0], 1.0, "done")
        store.record_event(failure_event(1))
        store.record_lease(leases[1], 1.0, "done")
        assert await store.write_now() is False
        store.record_lease(leases[2], 1.0, "done")
        store.record_event(failure_event(2))
        assert store.buffered == 3
    await store.flush()

    assert models_in(path) == ["m2"]
    assert lease_models(path) == ["m2", "m3"]
    assert store.dropped[RecordKind.LEASE] == 1 and store.dropped[RecordKind.EVENT] == 1
    await store.close()


def lease_models(path) -> list[str]:
    with sqlite3.connect(path) as db:
        return [row[0] for row in db.execute("SELECT model FROM leases ORDER BY id")]


def routine_lease(n: int, model: str = "m:latest") -> Lease:
    """A request served at once from a resident model."""
    return Lease(n, demand(model, 0), granted=0.0, waited=0.0, pending=0, loads=False)


def minute_rows(path) -> list[tuple[object, ...]]:
    with sqlite3.connect(path) as db:
        return db.execute(
            "SELECT minute, model, priority, outcome, leases, held_total, held_max"
            " FROM lease_minutes ORDER BY minute, model, outcome"
        ).fetchall()


async def test_routine_leases_are_counted_by_the_minute_and_the_others_get_rows(tmp_path):
    path = tmp_path / "gpugate.db"
    wall = [6000.0]  # the start of a minute
    store = Store(path, wall_clock=lambda: wall[0])
    await store.open()
    for n, held in enumerate((0.5, 2.0, 0.25), 1):
        store.record_lease(routine_lease(n), held, "done")
    store.record_lease(routine_lease(4), 1.0, "failed")
    store.record_lease(routine_lease(5, "other:latest"), 3.0, "done")
    loaded = Lease(6, demand("m:latest", 100), granted=0.0, waited=0.0, pending=0, loads=True)
    waited = Lease(7, demand("m:latest", 0), granted=0.0, waited=0.5, pending=0, loads=False)
    store.record_lease(loaded, 1.0, "done")
    store.record_lease(waited, 1.0, "done")
    # One record per minute row, however many leases it counts, and one per other lease.
    assert store.buffered == 5
    await store.flush()
    # The same minute again, after the first write: added to the row already there.
    wall[0] = 6059.5
    store.record_lease(routine_lease(8), 4.0, "done")
    wall[0] = 6060.0
    store.record_lease(routine_lease(9), 1.0, "done")
    await store.flush()
    await store.close()

    assert minute_rows(path) == [
        (6000.0, "m:latest", "interactive", "done", 4, 6.75, 4.0),
        (6000.0, "m:latest", "interactive", "failed", 1, 1.0, 1.0),
        (6000.0, "other:latest", "interactive", "done", 1, 3.0, 3.0),
        (6060.0, "m:latest", "interactive", "done", 1, 1.0, 1.0),
    ]
    with sqlite3.connect(path) as db:
        rows = db.execute("SELECT id, loaded, waited FROM leases ORDER BY id").fetchall()
    assert rows == [(6, 1, 0.0), (7, 0, 0.5)]


async def test_a_minute_kept_while_the_file_is_locked_counts_on_and_drops_as_one(tmp_path):
    path = tmp_path / "gpugate.db"
    store = Store(path, limit=2, busy_timeout=0.1, wall_clock=lambda: 6000.0)
    await store.open()
    with Locker(path):
        store.record_lease(routine_lease(1), 1.0, "done")
        assert await store.write_now() is False
        # Put back in the buffer: a lease after the failed write starts a tally of its own.
        store.record_lease(routine_lease(2), 1.0, "done")
        store.record_lease(routine_lease(3), 1.0, "done")
        assert store.buffered == 2
        # The buffer is full: the oldest tally goes, with the one lease it counted.
        store.record_event(failure_event(1))
        store.record_lease(routine_lease(4), 1.0, "done")
        assert store.buffered == 2
    await store.flush()
    await store.close()

    assert store.dropped[RecordKind.LEASE_MINUTE] == 1
    assert store.dropped[RecordKind.EVENT] == 0
    # What was left: the event, and the tally of leases 2 to 4 (4 joined it, as its
    # minute's record was still in the buffer).
    assert minute_rows(path) == [(6000.0, "m:latest", "interactive", "done", 3, 3.0, 1.0)]
    assert models_in(path) == ["m1"]


async def test_a_lone_surrogate_is_written_escaped_and_the_writer_goes_on(tmp_path):
    path = tmp_path / "gpugate.db"
    store = Store(path)
    await store.open()
    store.record_event(failure_event(1, detail="sent \udfff"))
    store.record_envelope(MeasuredEnvelope("ollama", "m\ud800:latest", "", 1))
    store.record_event(failure_event(2))
    await asyncio.wait_for(store.flush(), 5)
    store.record_event(failure_event(3))
    await asyncio.wait_for(store.flush(), 5)

    with sqlite3.connect(path) as db:
        details = db.execute("SELECT model, detail FROM events ORDER BY id").fetchall()
    assert details == [("m1", "sent \\udfff"), ("m2", ""), ("m3", "")]
    assert [e.model for e in await store.envelopes()] == ["m\\ud800:latest"]
    assert store.healthy and store.write_failures == 0
    assert set(store.dropped.values()) == {0}
    await store.close()


async def test_a_record_sqlite_cannot_bind_is_dropped_and_the_rest_written(tmp_path, caplog):
    path = tmp_path / "gpugate.db"
    store = Store(path)
    await store.open()
    store.record_event(failure_event(1))
    store.record_event(attrs.evolve(failure_event(2), bytes=2**70))  # past SQLite's int64
    store.record_event(failure_event(3))
    await asyncio.wait_for(store.flush(), 5)

    assert models_in(path) == ["m1", "m3"]
    assert store.dropped[RecordKind.EVENT] == 1 and store.healthy
    warnings = [r.getMessage() for r in caplog.records if r.name == "gpugate.store"]
    assert any("event record cannot be written" in m and "OverflowError" in m for m in warnings)
    await store.close()


async def test_an_error_in_the_writer_is_counted_logged_and_survived(tmp_path, caplog, monkeypatch):
    path = tmp_path / "gpugate.db"
    store = Store(path)
    await store.open()
    failed = asyncio.Event()
    rows = store_db.build_rows

    async def broken_once(batch, unwritable):
        if not failed.is_set():
            failed.set()
            raise RuntimeError("a bug")
        return await rows(batch, unwritable)

    monkeypatch.setattr(store_db, "build_rows", broken_once)
    store.record_event(failure_event(1))
    await asyncio.wait_for(failed.wait(), 5)
    await asyncio.sleep(0)  # the writer's handler runs in the same turn as the raise
    assert not store.healthy and store.write_failures == 1
    assert store.last_error == "RuntimeError: a bug" and store.buffered == 1
    errors = [r for r in caplog.records if r.name == "gpugate.store" and r.levelname == "ERROR"]
    assert len(errors) == 1 and "a bug" in errors[0].getMessage()

    await asyncio.wait_for(store.flush(), 5)
    assert models_in(path) == ["m1"] and store.healthy
    await store.close()


async def test_close_is_bounded_and_never_raises_when_the_writer_keeps_failing(
    tmp_path, monkeypatch
):
    path = tmp_path / "gpugate.db"
    store = Store(path)
    await store.open()

    async def broken(batch, unwritable):
        raise RuntimeError("a bug")

    monkeypatch.setattr(store_db, "build_rows", broken)
    store.record_event(failure_event(1))
    store.close_timeout = 0.3
    await asyncio.wait_for(store.close(), 0.3 + 1.0)
    assert store.dropped[RecordKind.EVENT] == 1 and store.buffered == 0


async def test_a_file_that_cannot_be_opened_leaves_the_store_down_until_it_can(tmp_path, caplog):
    # A directory where the file should be: SQLite cannot open it, even as root (which a
    # read-only mount would not stop here, where the tests run as root).
    path = tmp_path / "gpugate.db"
    path.mkdir()
    repair = path.rmdir
    store = Store(path)
    await store.open()  # does not raise: the gate starts without its database
    assert not store.opened and not store.healthy and store.write_failures == 1
    assert store.last_error is not None and store.last_error.startswith("cannot open")
    assert await store.envelopes() == [] and await store.history(None, 0.0) == []
    (line,) = [r.getMessage() for r in caplog.records if r.name == "gpugate.store"]
    assert f"cannot open {path} (" in line and "serving without the database" in line
    store.record_event(failure_event(1))

    repair()
    await asyncio.wait_for(store.flush(), 10)  # the writer's retries open it
    assert store.opened and store.healthy
    assert models_in(path) == ["m1"]
    await store.close()
