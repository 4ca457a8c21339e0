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

A file that cannot be opened at start (a read-only mount, a missing directory that cannot
be made) does not stop the gate either: `open` logs it and returns, and the writer tries
to open it again with the same backoff while records gather in the buffer.

A record the database cannot take (a value SQLite cannot bind, a constraint) must not stop
the others: the batch is written again record by record and the ones that fail are
dropped and counted. Anything else that goes wrong in the writer (a bug) is logged and
counted like a refused write, and the writer backs off and goes on: a writer that died
would stop every write for good while the gate went on as if nothing happened.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import sqlite3
import threading
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
CLOSE_DB_TIMEOUT = 0.5
"""At close, how long closing the connection may take after the last write."""
LOG_INTERVAL = 60.0


def refused(exc: BaseException) -> bool:
    """Whether an error is the database refusing writes (locked, full, read-only, I/O),
    worth retrying, rather than one record it cannot take (a constraint, a bad value)."""
    return isinstance(exc, sqlite3.OperationalError) or type(exc) is sqlite3.DatabaseError


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
        self.close_timeout = CLOSE_TIMEOUT
        """At close, how long the last write may take (`serve` lowers it to what is left of
        the shutdown grace)."""
        self._opened_once = False

    @property
    def buffered(self) -> int:
        """Records not yet committed."""
        return len(self._buffer) + len(self._inflight)

    @property
    def opened(self) -> bool:
        """Whether the file is open."""
        return self._db is not None

    @property
    def healthy(self) -> bool:
        """Whether the file is open, the writer runs and its last attempt succeeded."""
        writer_ok = self._writer is not None and not self._writer.done()
        return self._db is not None and writer_ok and self.last_error is None

    async def open(self) -> None:
        """Open the file and start the writer. A file that cannot be opened is logged and
        left to the writer to retry: admission does not depend on the store."""
        await self._connect()
        self._writer = asyncio.create_task(self._write_loop(), name="gpugate-store")

    async def _connect(self) -> bool:
        """Open and migrate the file; False (logged, counted, backoff set) when it cannot."""
        target = ":memory:" if self.path is None else str(self.path)
        db: aiosqlite.Connection | None = None
        try:
            if self.path is not None:
                self.path.parent.mkdir(parents=True, exist_ok=True)
            db = aiosqlite.connect(target, timeout=self.busy_timeout)
            thread = getattr(db, "_thread", None)
            if isinstance(thread, threading.Thread):
                # The interpreter waits for every non-daemon thread at exit: a SQLite call
                # stuck on a hung filesystem would keep a stopped gate alive for good. A
                # transaction cut short is rolled back from the journal at the next open.
                thread.daemon = True
            await db
            await db.execute("PRAGMA journal_mode=WAL")
            await self._migrate(db)
        except Exception as exc:
            if db is not None:
                await self._close_connection(db)
            self.write_failures += 1
            self.last_error = f"cannot open: {exc}"
            self._back_off()
            self._warn.warning(
                f"open:{exc}",
                "store: cannot open %s (%s); serving without the database, %d records kept,"
                " retry in %.1fs",
                target,
                exc,
                self.buffered,
                self._retry,
            )
            return False
        self._db = db
        if self._opened_once or self.last_error is not None:
            log.info("store: opened %s after %d failed attempts", target, self.write_failures)
        self._opened_once = True
        self.last_error = None
        self._retry = 0.0
        return True

    async def close(self) -> None:
        """Write what is buffered within `close_timeout`, then close the file. Never raises,
        and takes at most `close_timeout` + CLOSE_DB_TIMEOUT whatever the database does."""
        if self._writer is not None:
            self._closing = True
            self._wake.set()
            writer = self._writer
            self._writer = None
            await asyncio.wait({writer}, timeout=self.close_timeout)
            if not writer.done():
                # A cancelled writer stops at once: it only waits on the database thread,
                # which finishes its call on its own.
                writer.cancel()
                await asyncio.wait({writer})
            elif not writer.cancelled() and writer.exception() is not None:
                log.error("store: the writer for %s stopped: %r", self.path, writer.exception())
            self._requeue()
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
            db, self._db = self._db, None
            await self._close_connection(db)

    async def _close_connection(self, db: aiosqlite.Connection) -> None:
        """Close a connection within CLOSE_DB_TIMEOUT; past it, the (daemon) thread is told
        to stop once its current call returns, and the gate does not wait for it."""
        closing = asyncio.ensure_future(db.close())
        await asyncio.wait({closing}, timeout=CLOSE_DB_TIMEOUT)
        if not closing.done():
            closing.cancel()
            db.stop()
        elif not closing.cancelled() and closing.exception() is not None:
            log.warning("store: closing %s: %s", self.path, closing.exception())

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

    async def _migrate(self, db: aiosqlite.Connection) -> None:
        async with db.execute("PRAGMA user_version") as cursor:
            row = await cursor.fetchone()
        version = int(row[0]) if row else 0
        for number, script in enumerate(MIGRATIONS[version:], start=version + 1):
            await db.executescript(script)
            await db.execute(f"PRAGMA user_version = {number}")
            await db.commit()

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
        """The measured envelopes; none while the file is not open."""
        if self._db is None:
            return []
        async with self._db.execute(
            "SELECT consumer, model, options, bytes, scale, runtime_version, measured"
            " FROM envelopes ORDER BY consumer, model, options"
        ) as cursor:
            return [MeasuredEnvelope(*row) async for row in cursor]

    async def history(
        self, gpu: int | None, since: float, step: float = 60.0
    ) -> list[HistoryPoint]:
        """Snapshots since `since` (wall clock), the last one of each `step` seconds; none
        while the file is not open."""
        if self._db is None:
            return []
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
        async with self._write_lock:
            if self._db is None:
                return 0
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
            try:
                if self._db is None:
                    if self._closing:
                        return  # nothing can be written; close counts what is left
                    if not await self._connect():
                        continue
                await self.write_now()
            except Exception as exc:
                self._broken(exc)
            if self._closing:
                return

    async def _write_pending(self) -> bool:
        if self._db is None:
            return False
        if not self._buffer:
            return True
        db = self._db
        batch = list(self._buffer)
        self._buffer.clear()
        # Tallies taken now are not added to any more: later leases start new ones.
        self._minutes.clear()
        self._inflight = batch
        try:
            rows = await self._rows(batch)
            self._inflight = [record for record, _ in rows]
            try:
                # One statement per kind of row for the whole batch, in one transaction.
                grouped: dict[RecordKind, list[tuple[object, ...]]] = {}
                for (_, kind, _), row in rows:
                    grouped.setdefault(kind, []).append(row)
                for kind, kind_rows in grouped.items():
                    await db.executemany(INSERT[kind], kind_rows)
            except Exception as exc:
                if refused(exc):
                    raise
                # One record the database cannot take: the others must not wait on it.
                await db.rollback()
                gone = await self._insert_each(db, rows)
                self._inflight = [r for r in self._inflight if r[0] not in gone]
            await db.commit()
        except Exception as exc:
            if not refused(exc):
                raise
            with contextlib.suppress(Exception):
                await db.rollback()
            self._requeue()
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

    async def _rows(self, batch: list[Record]) -> list[tuple[Record, tuple[object, ...]]]:
        """Each record with its row; a record that cannot be made a row is dropped."""
        rows = []
        for i, record in enumerate(batch, 1):
            _, kind, params = record
            try:
                rows.append((record, row_of(kind, params)))
            except Exception as exc:
                self._unwritable(kind, exc)
            if i % ROWS_PER_TURN == 0:
                # A batch kept while the database refused writes can be thousands of rows:
                # built in turns, the requests waiting meanwhile are served.
                await asyncio.sleep(0)
        return rows

    async def _insert_each(
        self, db: aiosqlite.Connection, rows: list[tuple[Record, tuple[object, ...]]]
    ) -> set[int]:
        """Insert row by row (slow, only after a batch failed), dropping the rows the
        database cannot take (their sequence numbers are returned); a refusal of the
        database itself propagates."""
        gone = set()
        for (seq, kind, _), row in rows:
            try:
                await db.execute(INSERT[kind], row)
            except Exception as exc:
                if refused(exc):
                    raise
                self._unwritable(kind, exc)
                gone.add(seq)
        return gone

    def _unwritable(self, kind: RecordKind, exc: Exception) -> None:
        self.dropped[kind] += 1
        self._warn.warning(
            f"record:{kind.value}:{type(exc).__name__}",
            "store: a %s record cannot be written to %s (%s: %s); dropped",
            kind.value,
            self.path,
            type(exc).__name__,
            exc,
        )

    def _requeue(self) -> None:
        """Put the batch being written back at the front of the buffer."""
        if self._inflight:
            self._buffer.extendleft(reversed(self._inflight))
            self._inflight = []
            while len(self._buffer) > self.limit:
                self._drop_oldest()

    def _back_off(self) -> None:
        self._retry = min(RETRY_MAX, self._retry * 2) if self._retry else RETRY_INITIAL

    def _failed(self, exc: Exception) -> None:
        self.write_failures += 1
        self.last_error = str(exc)
        self._back_off()
        self._warn.warning(
            f"write:{exc}",
            "store: cannot write to %s (%s); %d records kept, %s dropped so far, retry in %.1fs",
            self.path,
            exc,
            self.buffered,
            sum(self.dropped.values()),
            self._retry,
        )

    def _broken(self, exc: Exception) -> None:
        """The writer met an error it has no rule for: counted and logged like a refused
        write (the store shows as down), the batch kept, and the writer goes on."""
        self._requeue()
        self.write_failures += 1
        self.last_error = f"{type(exc).__name__}: {exc}"
        self._back_off()
        self._warn.log(
            logging.ERROR,
            f"broken:{type(exc).__name__}",
            "store: writing to %s failed (%s: %s); %d records kept, retry in %.1fs",
            self.path,
            type(exc).__name__,
            exc,
            self.buffered,
            self._retry,
        )
        self._settle()

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
