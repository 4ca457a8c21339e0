"""The gate's SQLite file: written off the hot path, read at start-up.

A record is appended to a list in memory; one task commits what has gathered every
FLUSH_INTERVAL in one transaction, so neither a request nor the event loop waits on the
disk or on the database thread per row. Schema changes are numbered migrations applied
in order at open.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Sequence
from pathlib import Path

import aiosqlite
import attrs

from gpugate.core.effects import Event
from gpugate.core.tickets import Lease

FLUSH_INTERVAL = 0.5
"""Seconds between commits of what has been recorded."""

MIGRATIONS: Sequence[str] = (
    """
    CREATE TABLE events (
        id INTEGER PRIMARY KEY,
        wall REAL NOT NULL,
        kind TEXT NOT NULL,
        consumer TEXT,
        model TEXT,
        gpu INTEGER,
        bytes INTEGER,
        failure_class TEXT,
        detail TEXT
    );
    CREATE INDEX events_wall ON events (wall);
    CREATE TABLE leases (
        id INTEGER NOT NULL,
        started REAL NOT NULL,
        consumer TEXT NOT NULL,
        model TEXT NOT NULL,
        options TEXT NOT NULL,
        gpu INTEGER NOT NULL,
        priority TEXT NOT NULL,
        bytes INTEGER NOT NULL,
        loaded INTEGER NOT NULL,
        waited REAL NOT NULL,
        held REAL NOT NULL,
        outcome TEXT NOT NULL
    );
    CREATE TABLE envelopes (
        consumer TEXT NOT NULL,
        model TEXT NOT NULL,
        options TEXT NOT NULL,
        bytes INTEGER NOT NULL,
        measured REAL NOT NULL,
        PRIMARY KEY (consumer, model, options)
    );
    """,
)


@attrs.frozen
class MeasuredEnvelope:
    consumer: str
    model: str
    options: str
    bytes: int


_INSERT_LEASE = (
    "INSERT INTO leases (id, started, consumer, model, options, gpu, priority, bytes,"
    " loaded, waited, held, outcome) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
)


class Store:
    """One SQLite file (or `:memory:`), one writer task."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self._db: aiosqlite.Connection | None = None
        self._pending: list[tuple[str, tuple[object, ...]]] = []
        self._flushed: list[asyncio.Future[None]] = []
        self._wake = asyncio.Event()
        self._closing = False
        self._writer: asyncio.Task[None] | None = None

    async def open(self) -> None:
        target = ":memory:" if self.path is None else str(self.path)
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        self._db = await aiosqlite.connect(target)
        await self._db.execute("PRAGMA journal_mode=WAL")
        await self._migrate()
        self._writer = asyncio.create_task(self._write_loop(), name="gpugate-store")

    async def close(self) -> None:
        if self._writer is not None:
            self._closing = True
            self._wake.set()
            with contextlib.suppress(asyncio.CancelledError):
                await self._writer
            self._writer = None
        if self._db is not None:
            await self._db.close()
            self._db = None

    async def schema_version(self) -> int:
        assert self._db is not None
        async with self._db.execute("PRAGMA user_version") as cursor:
            row = await cursor.fetchone()
        return int(row[0]) if row else 0

    async def _migrate(self) -> None:
        assert self._db is not None
        version = await self.schema_version()
        for number, script in enumerate(MIGRATIONS[version:], start=version + 1):
            await self._db.executescript(script)
            await self._db.execute(f"PRAGMA user_version = {number}")
            await self._db.commit()

    # -- writes (queued) -------------------------------------------------------------------

    def record_event(self, event: Event) -> None:
        failure = event.failure.failure_class.value if event.failure else None
        self._pending.append(
            (
                "INSERT INTO events (wall, kind, consumer, model, gpu, bytes, failure_class,"
                " detail) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    time.time(),
                    event.kind.value,
                    event.consumer,
                    event.model,
                    event.gpu,
                    event.bytes,
                    failure,
                    event.detail,
                ),
            )
        )

    def record_lease(self, lease: Lease, held: float, outcome: str) -> None:
        """A finished lease, for the history table."""
        self._pending.append(
            (
                _INSERT_LEASE,
                (
                    lease.id,
                    time.time() - held,
                    lease.key.consumer,
                    lease.key.model,
                    lease.key.options,
                    lease.gpu,
                    lease.demand.priority.label,
                    lease.demand.envelope,
                    int(lease.loads),
                    lease.waited,
                    held,
                    outcome,
                ),
            )
        )

    def record_envelope(self, envelope: MeasuredEnvelope) -> None:
        self._pending.append(
            (
                "INSERT INTO envelopes (consumer, model, options, bytes, measured)"
                " VALUES (?, ?, ?, ?, ?) ON CONFLICT (consumer, model, options)"
                " DO UPDATE SET bytes = excluded.bytes, measured = excluded.measured",
                (envelope.consumer, envelope.model, envelope.options, envelope.bytes, time.time()),
            )
        )

    async def flush(self) -> None:
        """Wait until everything recorded so far is committed."""
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._flushed.append(done)
        self._wake.set()
        await done

    # -- reads -----------------------------------------------------------------------------

    async def envelopes(self) -> list[MeasuredEnvelope]:
        assert self._db is not None
        async with self._db.execute(
            "SELECT consumer, model, options, bytes FROM envelopes"
        ) as cursor:
            return [MeasuredEnvelope(*row) async for row in cursor]

    async def _write_loop(self) -> None:
        assert self._db is not None
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), FLUSH_INTERVAL)
            self._wake.clear()
            batch, self._pending = self._pending, []
            waiting, self._flushed = self._flushed, []
            if batch:
                # One statement per kind of row for the whole batch, in one transaction.
                grouped: dict[str, list[tuple[object, ...]]] = {}
                for sql, params in batch:
                    grouped.setdefault(sql, []).append(params)
                for sql, rows in grouped.items():
                    await self._db.executemany(sql, rows)
                await self._db.commit()
            for done in waiting:
                if not done.done():
                    done.set_result(None)
            if self._closing:
                return
