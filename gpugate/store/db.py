"""The gate's SQLite file: written off the hot path, read at start-up.

A record is appended to a bounded buffer in memory; one task commits what has gathered
every FLUSH_INTERVAL in one transaction, so neither a request nor the event loop waits
on the disk or on the database thread per row. Schema changes are numbered migrations
applied in order at open.

The database may refuse writes for a while: another process holds a write transaction
(`database is locked`) or the disk is full (`database or disk is full`). Admission never
depends on the store, so the gate goes on; the batch is rolled back and put back at the
front of the buffer, and the writer tries again with a backoff that doubles up to
RETRY_MAX. What fits in the buffer is written once the database takes writes again. When
the buffer is full the **oldest** record is dropped, because the newest ones describe
the state an operator will look at (and a newer envelope supersedes an older one), and
every drop is counted by kind (`gpugate_store_dropped_total`). A write failure is not a
failure event: the failure classes describe what happened to a GPU request, and an event
about the store would go into the store that cannot take it. It is a warning logged once
per LOG_INTERVAL with a count, and the counters and gauges in `metrics.py`.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import enum
import logging
import sqlite3
import time
from collections.abc import Sequence
from pathlib import Path

import aiosqlite
import attrs

from gpugate.core.effects import Event
from gpugate.core.tickets import Lease
from gpugate.logs import OncePerInterval

log = logging.getLogger("gpugate.store")

FLUSH_INTERVAL = 0.5
"""Seconds between commits of what has been recorded."""
BUFFER_LIMIT = 10_000
"""Records kept while the database refuses writes; beyond it the oldest are dropped."""
BUSY_TIMEOUT = 1.0
"""Seconds a write waits for another process's lock before it counts as failed."""
RETRY_INITIAL = 0.5
RETRY_MAX = 30.0
"""Backoff between write attempts while the database refuses them."""
CLOSE_TIMEOUT = 5.0
"""At close, how long the last write may take before what is left is given up."""
LOG_INTERVAL = 60.0

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
    # A job's measured peak is kept with the scale it ran at (ComfyUI: megapixels).
    "ALTER TABLE envelopes ADD COLUMN scale REAL;",
    # 3: the minute history (one row per GPU a minute; `rows` is the budget's rows as
    # compact JSON) and the runtime version an envelope was measured under.
    """
    CREATE TABLE history (
        gpu INTEGER NOT NULL,
        wall REAL NOT NULL,
        total INTEGER NOT NULL,
        driver_reserved INTEGER NOT NULL,
        used INTEGER NOT NULL,
        free INTEGER NOT NULL,
        external INTEGER NOT NULL,
        committed INTEGER NOT NULL,
        pending INTEGER NOT NULL,
        reserve INTEGER NOT NULL,
        schedulable INTEGER NOT NULL,
        residents INTEGER NOT NULL,
        queue INTEGER NOT NULL,
        sample_age REAL,
        pressure INTEGER NOT NULL,
        rows TEXT NOT NULL,
        PRIMARY KEY (gpu, wall)
    ) WITHOUT ROWID;
    ALTER TABLE envelopes ADD COLUMN runtime_version TEXT;
    """,
)


class RecordKind(enum.Enum):
    """What a buffered record is (the label of the store's metrics)."""

    EVENT = "event"
    LEASE = "lease"
    ENVELOPE = "envelope"
    HISTORY = "history"


_INSERT = {
    RecordKind.EVENT: "INSERT INTO events (wall, kind, consumer, model, gpu, bytes,"
    " failure_class, detail) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
    RecordKind.LEASE: "INSERT INTO leases (id, started, consumer, model, options, gpu,"
    " priority, bytes, loaded, waited, held, outcome) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
    RecordKind.ENVELOPE: "INSERT INTO envelopes (consumer, model, options, bytes, measured,"
    " scale, runtime_version) VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT (consumer, model, options)"
    " DO UPDATE SET bytes = excluded.bytes, measured = excluded.measured,"
    " scale = excluded.scale, runtime_version = excluded.runtime_version",
    RecordKind.HISTORY: "INSERT OR REPLACE INTO history (gpu, wall, total, driver_reserved,"
    " used, free, external, committed, pending, reserve, schedulable, residents, queue,"
    " sample_age, pressure, rows) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
}

HISTORY_COLUMNS = (
    "gpu",
    "wall",
    "total",
    "driver_reserved",
    "used",
    "free",
    "external",
    "committed",
    "pending",
    "reserve",
    "schedulable",
    "residents",
    "queue",
    "sample_age",
    "pressure",
    "rows",
)


@attrs.frozen
class MeasuredEnvelope:
    consumer: str
    model: str
    options: str
    bytes: int
    scale: float | None = None
    """For a job's peak: the scale it ran at (the runtime's unit, e.g. megapixels)."""
    runtime_version: str | None = None
    """The runtime's version when it was measured; None when it was not known."""
    measured: float | None = attrs.field(default=None, eq=False)
    """Wall-clock time of the measurement (set when read back; not part of equality)."""


@attrs.frozen
class HistoryPoint:
    """One GPU's budget at one minute (or the last of a downsampled step)."""

    gpu: int
    wall: float
    total: int
    driver_reserved: int
    used: int
    free: int
    external: int
    committed: int
    pending: int
    reserve: int
    schedulable: int
    residents: int
    queue: int
    sample_age: float | None
    pressure: bool
    rows: str
    """JSON: {"external": {service: bytes}, "consumers": {name: [committed, pending]}}."""
    schedulable_min: int | None = None
    """The least schedulable within the step (None: a single row)."""


_Record = tuple[int, RecordKind, tuple[object, ...]]
"""A buffered record: its sequence number, its kind and its row — or for a lease (lease,
held, outcome, wall time), which the writer turns into its row."""


def lease_row(lease: Lease, held: float, outcome: str, wall: float) -> tuple[object, ...]:
    """A finished lease's row in the `leases` table (`wall`: when it was recorded)."""
    demand = lease.demand
    key = demand.key
    return (
        lease.id,
        wall - held,
        key.consumer,
        key.model,
        key.options,
        demand.gpu,
        demand.priority.label,
        demand.envelope,
        int(lease.loads),
        lease.waited,
        held,
        outcome,
    )


class Store:
    """One SQLite file (or `:memory:`), one writer task, a bounded buffer in front of it."""

    def __init__(
        self,
        path: Path | None,
        *,
        limit: int = BUFFER_LIMIT,
        busy_timeout: float = BUSY_TIMEOUT,
    ) -> None:
        self.path = path
        self.limit = limit
        self.busy_timeout = busy_timeout
        self._db: aiosqlite.Connection | None = None
        self._buffer: collections.deque[_Record] = collections.deque()
        self._inflight: list[_Record] = []
        self._seq = 0
        self._flushed: list[tuple[int, asyncio.Future[None]]] = []
        self._wake = asyncio.Event()
        self._write_lock = asyncio.Lock()
        self._closing = False
        self._writer: asyncio.Task[None] | None = None
        self._retry = 0.0
        self._warn = OncePerInterval(log, LOG_INTERVAL)
        self.dropped: dict[RecordKind, int] = dict.fromkeys(RecordKind, 0)
        """Records given up, by kind: the buffer was full, or the gate stopped first."""
        self.write_failures = 0
        """Write attempts the database refused."""
        self.last_error: str | None = None
        """Why the last attempt failed; None once a write succeeds."""

    @property
    def buffered(self) -> int:
        """Records not yet committed."""
        return len(self._buffer) + len(self._inflight)

    @property
    def healthy(self) -> bool:
        """Whether the last write attempt succeeded."""
        return self.last_error is None

    async def open(self) -> None:
        target = ":memory:" if self.path is None else str(self.path)
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        self._db = await aiosqlite.connect(target, timeout=self.busy_timeout)
        await self._db.execute("PRAGMA journal_mode=WAL")
        await self._migrate()
        self._writer = asyncio.create_task(self._write_loop(), name="gpugate-store")

    async def close(self) -> None:
        """Write what is buffered, within CLOSE_TIMEOUT; a locked database cannot hold it up."""
        if self._writer is not None:
            self._closing = True
            self._wake.set()
            writer = self._writer
            try:
                await asyncio.wait_for(asyncio.shield(writer), CLOSE_TIMEOUT)
            except TimeoutError:
                writer.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await writer
            self._writer = None
        left = [*self._inflight, *self._buffer]
        if left:
            for _, kind, _ in left:
                self.dropped[kind] += 1
            log.warning(
                "store: %d records were not written to %s before the gate stopped: %s",
                len(left),
                self.path,
                self.last_error or "the last write did not finish in time",
            )
            self._buffer.clear()
            self._inflight = []
        self._settle()
        if self._db is not None:
            await self._db.close()
            self._db = None

    async def schema_version(self) -> int:
        assert self._db is not None
        async with self._db.execute("PRAGMA user_version") as cursor:
            row = await cursor.fetchone()
        return int(row[0]) if row else 0

    async def set_max_page_count(self, pages: int) -> int:
        """Cap the file at `pages` pages (SQLite's `max_page_count`); returns the cap in force.

        SQLite never sets it below the file's current size. A write that would grow the
        file past it fails as a full disk does (SQLITE_FULL).
        """
        assert self._db is not None
        async with self._db.execute(f"PRAGMA max_page_count = {int(pages)}") as cursor:
            row = await cursor.fetchone()
        return int(row[0]) if row else 0

    async def page_count(self) -> int:
        """The file's size in pages."""
        assert self._db is not None
        async with self._db.execute("PRAGMA page_count") as cursor:
            row = await cursor.fetchone()
        return int(row[0]) if row else 0

    async def _migrate(self) -> None:
        assert self._db is not None
        version = await self.schema_version()
        for number, script in enumerate(MIGRATIONS[version:], start=version + 1):
            await self._db.executescript(script)
            await self._db.execute(f"PRAGMA user_version = {number}")
            await self._db.commit()

    # -- writes (buffered) -----------------------------------------------------------------

    def _append(self, kind: RecordKind, params: tuple[object, ...]) -> None:
        if len(self._buffer) >= self.limit:
            self._drop_oldest()
        self._seq += 1
        self._buffer.append((self._seq, kind, params))

    def _drop_oldest(self) -> None:
        self.dropped[self._buffer.popleft()[1]] += 1

    def record_event(self, event: Event) -> None:
        failure = event.failure.failure_class.value if event.failure else None
        self._append(
            RecordKind.EVENT,
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

    def record_lease(self, lease: Lease, held: float, outcome: str) -> None:
        """A finished lease, for the history table. One a request: its row is built when
        the batch is written, off the request path."""
        if len(self._buffer) >= self.limit:
            self._drop_oldest()
        self._seq += 1
        self._buffer.append((self._seq, RecordKind.LEASE, (lease, held, outcome, time.time())))

    def record_envelope(self, envelope: MeasuredEnvelope) -> None:
        self._append(
            RecordKind.ENVELOPE,
            (
                envelope.consumer,
                envelope.model,
                envelope.options,
                envelope.bytes,
                envelope.measured if envelope.measured is not None else time.time(),
                envelope.scale,
                envelope.runtime_version,
            ),
        )

    def record_history(self, point: HistoryPoint) -> None:
        """One GPU's minute snapshot (buffered like every other record)."""
        self._append(
            RecordKind.HISTORY,
            (
                *(getattr(point, name) for name in HISTORY_COLUMNS[:-2]),
                int(point.pressure),
                point.rows,
            ),
        )

    async def flush(self) -> None:
        """Wait until everything recorded so far is committed (or dropped to make room)."""
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._flushed.append((self._seq, done))
        self._settle()
        self._wake.set()
        await done

    async def write_now(self) -> bool:
        """Try once to commit what is buffered; False when the database refused."""
        async with self._write_lock:
            return await self._write_pending()

    # -- reads -----------------------------------------------------------------------------

    async def envelopes(self) -> list[MeasuredEnvelope]:
        assert self._db is not None
        async with self._db.execute(
            "SELECT consumer, model, options, bytes, scale, runtime_version, measured"
            " FROM envelopes ORDER BY consumer, model, options"
        ) as cursor:
            return [MeasuredEnvelope(*row) async for row in cursor]

    async def history(
        self, gpu: int | None, since: float, step: float = 60.0
    ) -> list[HistoryPoint]:
        """Snapshots since `since` (wall clock), the last one of each `step` seconds."""
        assert self._db is not None
        # SQLite takes the bare columns of a group from the row that has its max(wall).
        columns = ", ".join("max(wall)" if c == "wall" else c for c in HISTORY_COLUMNS)
        where = "wall >= ?" + ("" if gpu is None else " AND gpu = ?")
        params: tuple[object, ...] = (since,) if gpu is None else (since, gpu)
        query = (
            f"SELECT {columns}, min(schedulable), count(*) FROM history WHERE {where}"
            f" GROUP BY gpu, CAST(wall / {float(max(step, 1.0))!r} AS INTEGER)"
            " ORDER BY gpu, 2"
        )
        async with self._db.execute(query, params) as cursor:
            points = []
            async for row in cursor:
                *fields, low, count = row
                fields[14] = bool(fields[14])
                points.append(HistoryPoint(*fields, schedulable_min=low if count > 1 else None))
            return points

    async def prune_history(self, before: float) -> int:
        """Delete snapshots older than `before` (wall clock); how many went."""
        assert self._db is not None
        async with self._write_lock:
            cursor = await self._db.execute("DELETE FROM history WHERE wall < ?", (before,))
            await self._db.commit()
            return cursor.rowcount

    # -- the writer ------------------------------------------------------------------------

    async def _write_loop(self) -> None:
        while True:
            if not self._closing:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), self._retry or FLUSH_INTERVAL)
            self._wake.clear()
            await self.write_now()
            if self._closing:
                return

    async def _write_pending(self) -> bool:
        assert self._db is not None
        if not self._buffer:
            return True
        batch = list(self._buffer)
        self._buffer.clear()
        self._inflight = batch
        try:
            # One statement per kind of row for the whole batch, in one transaction.
            grouped: dict[RecordKind, list[tuple[object, ...]]] = {}
            for _, kind, params in batch:
                row = lease_row(*params) if kind is RecordKind.LEASE else params  # type: ignore[arg-type]
                grouped.setdefault(kind, []).append(row)
            for kind, rows in grouped.items():
                await self._db.executemany(_INSERT[kind], rows)
            await self._db.commit()
        except sqlite3.Error as exc:
            with contextlib.suppress(sqlite3.Error):
                await self._db.rollback()
            self._inflight = []
            self._buffer.extendleft(reversed(batch))
            while len(self._buffer) > self.limit:
                self._drop_oldest()
            self._failed(exc)
            self._settle()
            return False
        self._inflight = []
        if self.last_error is not None:
            log.info(
                "store: writes to %s resumed after %d failed attempts; %d records dropped",
                self.path,
                self.write_failures,
                sum(self.dropped.values()),
            )
        self.last_error = None
        self._retry = 0.0
        self._settle()
        return True

    def _failed(self, exc: sqlite3.Error) -> None:
        self.write_failures += 1
        self.last_error = str(exc)
        self._retry = min(RETRY_MAX, self._retry * 2) if self._retry else RETRY_INITIAL
        self._warn.warning(
            f"write:{exc}",
            "store: cannot write to %s (%s); %d records kept, %s dropped so far, retry in %.1fs",
            self.path,
            exc,
            self.buffered,
            sum(self.dropped.values()),
            self._retry,
        )

    def _settle(self) -> None:
        """Wake the flushes whose records are all committed or dropped."""
        pending = self._inflight[0][0] if self._inflight else None
        if pending is None and self._buffer:
            pending = self._buffer[0][0]
        settled = self._seq if pending is None else pending - 1
        still = []
        for target, done in self._flushed:
            if done.done():
                continue
            if target <= settled:
                done.set_result(None)
            else:
                still.append((target, done))
        self._flushed = still
