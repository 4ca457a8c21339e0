"""The gate's SQLite file: written off the hot path, read at start-up.

A record is appended to a bounded buffer in memory; one task commits what has gathered
every FLUSH_INTERVAL in one transaction, so neither a request nor the event loop waits
on the disk or on the database thread per row. Schema changes are numbered migrations
applied in order at open (`schema.py`).

A lease that loaded a model, waited or holds a job or process gets a row of its own in
`leases`. A request served from a resident model at once is routine, and a busy listener
serves thousands a second: those are counted in `lease_minutes`, one row per minute per
consumer, model, options, GPU, class and outcome, with how many, their total and longest
hold. A row per routine request would make each batch thousands of rows long (the
event loop waits while they are built and bound) and grow the file by gigabytes a day.

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
import logging
import sqlite3
import time
from collections.abc import Callable
from pathlib import Path

import aiosqlite

from gpugate.core.effects import Event
from gpugate.core.tickets import Lease
from gpugate.logs import OncePerInterval
from gpugate.store.schema import (
    HISTORY_COLUMNS,
    INSERT,
    MIGRATIONS,
    HistoryPoint,
    MeasuredEnvelope,
    MinuteKey,
    MinuteTally,
    Record,
    RecordKind,
    minute_key,
    routine,
    row_of,
)

__all__ = ["MIGRATIONS", "HistoryPoint", "MeasuredEnvelope", "RecordKind", "Store"]

log = logging.getLogger("gpugate.store")

FLUSH_INTERVAL = 0.5
"""Seconds between commits of what has been recorded."""
ROWS_PER_TURN = 256
"""Rows of a batch built between two turns of the event loop (about a millisecond)."""
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


class Store:
    """One SQLite file (or `:memory:`), one writer task, a bounded buffer in front of it."""

    def __init__(
        self,
        path: Path | None,
        *,
        limit: int = BUFFER_LIMIT,
        busy_timeout: float = BUSY_TIMEOUT,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self.path = path
        self._wall = wall_clock
        self.limit = limit
        self.busy_timeout = busy_timeout
        self._db: aiosqlite.Connection | None = None
        self._buffer: collections.deque[Record] = collections.deque()
        self._inflight: list[Record] = []
        self._seq = 0
        self._minutes: dict[MinuteKey, MinuteTally] = {}
        """The minute tallies whose records are still in the buffer."""
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

    def _append(self, kind: RecordKind, params: tuple[object, ...] | MinuteTally) -> None:
        if len(self._buffer) >= self.limit:
            self._drop_oldest()
        self._seq += 1
        self._buffer.append((self._seq, kind, params))

    def _drop_oldest(self) -> None:
        _, kind, record = self._buffer.popleft()
        self.dropped[kind] += 1
        if isinstance(record, MinuteTally) and self._minutes.get(record.key) is record:
            del self._minutes[record.key]

    def record_event(self, event: Event) -> None:
        failure = event.failure.failure_class.value if event.failure else None
        self._append(
            RecordKind.EVENT,
            (
                self._wall(),
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
        """A finished lease, for the history tables: a row of its own (built when the batch
        is written, off the request path), or for a routine request a count in its
        minute's row."""
        wall = self._wall()
        if routine(lease):
            key = minute_key(lease, outcome, wall)
            tally = self._minutes.get(key)
            if tally is None:
                tally = self._minutes[key] = MinuteTally(key)
                self._append(RecordKind.LEASE_MINUTE, tally)
            tally.add(held)
            return
        self._append(RecordKind.LEASE, (lease, held, outcome, wall))

    def record_envelope(self, envelope: MeasuredEnvelope) -> None:
        self._append(
            RecordKind.ENVELOPE,
            (
                envelope.consumer,
                envelope.model,
                envelope.options,
                envelope.bytes,
                envelope.measured if envelope.measured is not None else self._wall(),
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
        # Tallies taken now are not added to any more: later leases start new ones.
        self._minutes.clear()
        self._inflight = batch
        try:
            # One statement per kind of row for the whole batch, in one transaction.
            grouped: dict[RecordKind, list[tuple[object, ...]]] = {}
            for i, (_, kind, params) in enumerate(batch, 1):
                grouped.setdefault(kind, []).append(row_of(kind, params))
                if i % ROWS_PER_TURN == 0:
                    # A batch kept while the database refused writes can be thousands of
                    # rows: built in turns, the requests waiting meanwhile are served.
                    await asyncio.sleep(0)
            for kind, rows in grouped.items():
                await self._db.executemany(INSERT[kind], rows)
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
