"""What the store runs on its SQLite connection: opening and migrating, batched inserts, reads."""

from __future__ import annotations

import asyncio
import logging
import sqlite3
import threading
from collections.abc import Callable
from pathlib import Path

import aiosqlite

from gpugate.store.schema import (
    HISTORY_COLUMNS,
    INSERT,
    MIGRATIONS,
    HistoryPoint,
    MeasuredEnvelope,
    Record,
    RecordKind,
    row_of,
)

log = logging.getLogger("gpugate.store")

CLOSE_DB_TIMEOUT = 0.5
"""At close, how long closing the connection may take after the last write."""
ROWS_PER_TURN = 256
"""Rows of a batch built between two turns of the event loop (about a millisecond)."""


def refused(exc: BaseException) -> bool:
    """Whether an error is the database refusing writes (locked, full, read-only, I/O),
    worth retrying, rather than one record it cannot take (a constraint, a bad value)."""
    return isinstance(exc, sqlite3.OperationalError) or type(exc) is sqlite3.DatabaseError


def target(path: Path | None) -> str:
    """What SQLite opens for `path`: the file, or `:memory:` for None."""
    return ":memory:" if path is None else str(path)


async def open_database(path: Path | None, busy_timeout: float) -> aiosqlite.Connection:
    """Open and migrate the file (making its directory); a connection opened before an
    error is closed before the error propagates."""
    db: aiosqlite.Connection | None = None
    try:
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
        db = aiosqlite.connect(target(path), timeout=busy_timeout)
        thread = getattr(db, "_thread", None)
        if isinstance(thread, threading.Thread):
            # The interpreter waits for every non-daemon thread at exit: a SQLite call
            # stuck on a hung filesystem would keep a stopped gate alive for good. A
            # transaction cut short is rolled back from the journal at the next open.
            thread.daemon = True
        await db
        await db.execute("PRAGMA journal_mode=WAL")
        await migrate(db)
    except Exception:
        if db is not None:
            await close_database(db, path)
        raise
    return db


async def close_database(db: aiosqlite.Connection, path: Path | None) -> None:
    """Close a connection within CLOSE_DB_TIMEOUT; past it, the (daemon) thread is told
    to stop once its current call returns, and the gate does not wait for it."""
    closing = asyncio.ensure_future(db.close())
    await asyncio.wait({closing}, timeout=CLOSE_DB_TIMEOUT)
    if not closing.done():
        closing.cancel()
        db.stop()
    elif not closing.cancelled() and closing.exception() is not None:
        log.warning("store: closing %s: %s", path, closing.exception())


async def pragma(db: aiosqlite.Connection, statement: str) -> int:
    """The number a PRAGMA statement answers (0 when it answers nothing)."""
    async with db.execute(statement) as cursor:
        row = await cursor.fetchone()
    return int(row[0]) if row else 0


async def migrate(db: aiosqlite.Connection) -> None:
    """Apply the migrations the file has not had yet, each in its own commit."""
    version = await pragma(db, "PRAGMA user_version")
    for number, script in enumerate(MIGRATIONS[version:], start=version + 1):
        await db.executescript(script)
        await db.execute(f"PRAGMA user_version = {number}")
        await db.commit()


# -- writes --------------------------------------------------------------------------------


async def build_rows(
    batch: list[Record], unwritable: Callable[[RecordKind, Exception], None]
) -> list[tuple[Record, tuple[object, ...]]]:
    """Each record with its row; a record that cannot be made a row is dropped (told to
    `unwritable`)."""
    rows = []
    for i, record in enumerate(batch, 1):
        _, kind, params = record
        try:
            rows.append((record, row_of(kind, params)))
        except Exception as exc:
            unwritable(kind, exc)
        if i % ROWS_PER_TURN == 0:
            # A batch kept while the database refused writes can be thousands of rows:
            # built in turns, the requests waiting meanwhile are served.
            await asyncio.sleep(0)
    return rows


async def insert_batch(
    db: aiosqlite.Connection, rows: list[tuple[Record, tuple[object, ...]]]
) -> None:
    """One statement per kind of row for the whole batch (in the caller's transaction)."""
    grouped: dict[RecordKind, list[tuple[object, ...]]] = {}
    for (_, kind, _), row in rows:
        grouped.setdefault(kind, []).append(row)
    for kind, kind_rows in grouped.items():
        await db.executemany(INSERT[kind], kind_rows)


async def insert_each(
    db: aiosqlite.Connection,
    rows: list[tuple[Record, tuple[object, ...]]],
    unwritable: Callable[[RecordKind, Exception], None],
) -> set[int]:
    """Insert row by row (slow, only after a batch failed), dropping the rows the
    database cannot take (their sequence numbers are returned, each told to `unwritable`);
    a refusal of the database itself propagates."""
    gone = set()
    for (seq, kind, _), row in rows:
        try:
            await db.execute(INSERT[kind], row)
        except Exception as exc:
            if refused(exc):
                raise
            unwritable(kind, exc)
            gone.add(seq)
    return gone


# -- reads ---------------------------------------------------------------------------------


async def read_envelopes(db: aiosqlite.Connection) -> list[MeasuredEnvelope]:
    """The measured envelopes."""
    async with db.execute(
        "SELECT consumer, model, options, bytes, scale, runtime_version, measured"
        " FROM envelopes ORDER BY consumer, model, options"
    ) as cursor:
        return [MeasuredEnvelope(*row) async for row in cursor]


async def read_history(
    db: aiosqlite.Connection, gpu: int | None, since: float, step: float
) -> list[HistoryPoint]:
    """Snapshots since `since` (wall clock), the last one of each `step` seconds."""
    # SQLite takes the bare columns of a group from the row that has its max(wall).
    columns = ", ".join("max(wall)" if c == "wall" else c for c in HISTORY_COLUMNS)
    where = "wall >= ?" + ("" if gpu is None else " AND gpu = ?")
    params: tuple[object, ...] = (since,) if gpu is None else (since, gpu)
    query = (
        f"SELECT {columns}, min(schedulable), count(*) FROM history WHERE {where}"
        f" GROUP BY gpu, CAST(wall / {float(max(step, 1.0))!r} AS INTEGER)"
        " ORDER BY gpu, 2"
    )
    async with db.execute(query, params) as cursor:
        points = []
        async for row in cursor:
            *fields, low, count = row
            fields[14] = bool(fields[14])
            points.append(HistoryPoint(*fields, schedulable_min=low if count > 1 else None))
        return points


async def delete_history(db: aiosqlite.Connection, before: float) -> int:
    """Delete snapshots older than `before` (wall clock) and commit; how many went."""
    cursor = await db.execute("DELETE FROM history WHERE wall < ?", (before,))
    await db.commit()
    return cursor.rowcount
