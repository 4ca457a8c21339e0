"""The gate's SQLite file: written off the hot path, read at start-up.

A record is appended to a bounded buffer in memory; one task commits what has gathered
every FLUSH_INTERVAL in one transaction, so neither a request nor the event loop waits
on the disk or on the database thread per row (`buffer.py`). Schema changes are numbered
migrations (`schema.py`) applied in order at open (`sql.py`, which holds every statement).

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
RETRY_MAX. What fits in the buffer is written once the database takes writes again; when
it is full the oldest record is dropped and counted (`buffer.py`). A write failure is not a
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
import contextlib
import logging
import time
from collections.abc import Callable
from pathlib import Path

import aiosqlite

from gpugate.core.effects import Event
from gpugate.core.tickets import Lease
from gpugate.logs import OncePerInterval
from gpugate.store.buffer import RecordBuffer
from gpugate.store.schema import (
    MIGRATIONS,
    HistoryPoint,
    MeasuredEnvelope,
    RecordKind,
    envelope_row,
    event_row,
    history_row,
    minute_key,
    routine,
)
from gpugate.store.sql import (
    build_rows,
    close_database,
    delete_history,
    insert_batch,
    insert_each,
    open_database,
    pragma,
    read_envelopes,
    read_history,
    refused,
    target,
)

__all__ = ["MIGRATIONS", "HistoryPoint", "MeasuredEnvelope", "RecordKind", "Store"]

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
        self.busy_timeout = busy_timeout
        self._db: aiosqlite.Connection | None = None
        self._buffer = RecordBuffer(limit)
        self._wake = asyncio.Event()
        self._write_lock = asyncio.Lock()
        self._closing = False
        self._writer: asyncio.Task[None] | None = None
        self._retry = 0.0
        self._warn = OncePerInterval(log, LOG_INTERVAL)
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
        return self._buffer.buffered

    @property
    def dropped(self) -> dict[RecordKind, int]:
        """Records given up, by kind: the buffer was full, or the gate stopped first."""
        return self._buffer.dropped

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
        file = target(self.path)
        try:
            db = await open_database(self.path, self.busy_timeout)
        except Exception as exc:
            self.write_failures += 1
            self.last_error = f"cannot open: {exc}"
            self._back_off()
            self._warn.warning(
                f"open:{exc}",
                "store: cannot open %s (%s); serving without the database, %d records kept,"
                " retry in %.1fs",
                file,
                exc,
                self.buffered,
                self._retry,
            )
            return False
        self._db = db
        if self._opened_once or self.last_error is not None:
            log.info("store: opened %s after %d failed attempts", file, self.write_failures)
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
            self._buffer.requeue()
        left = self._buffer.give_up()
        if left:
            log.warning(
                "store: %d records were not written to %s before the gate stopped: %s",
                left,
                self.path,
                self.last_error or "the last write did not finish in time",
            )
        self._buffer.settle()
        if self._db is not None:
            db, self._db = self._db, None
            await close_database(db, self.path)

    async def schema_version(self) -> int:
        assert self._db is not None
        return await pragma(self._db, "PRAGMA user_version")

    async def set_max_page_count(self, pages: int) -> int:
        """Cap the file at `pages` pages (SQLite's `max_page_count`); returns the cap in force.

        SQLite never sets it below the file's current size. A write that would grow the
        file past it fails as a full disk does (SQLITE_FULL).
        """
        assert self._db is not None
        return await pragma(self._db, f"PRAGMA max_page_count = {int(pages)}")

    async def page_count(self) -> int:
        """The file's size in pages."""
        assert self._db is not None
        return await pragma(self._db, "PRAGMA page_count")

    # -- writes (buffered) -----------------------------------------------------------------

    def record_event(self, event: Event) -> None:
        self._buffer.append(RecordKind.EVENT, event_row(event, self._wall()))

    def record_lease(self, lease: Lease, held: float, outcome: str) -> None:
        """A finished lease, for the history tables: a row of its own (built when the batch
        is written, off the request path), or for a routine request a count in its
        minute's row."""
        wall = self._wall()
        if routine(lease):
            self._buffer.count_minute(minute_key(lease, outcome, wall), held)
            return
        self._buffer.append(RecordKind.LEASE, (lease, held, outcome, wall))

    def record_envelope(self, envelope: MeasuredEnvelope) -> None:
        self._buffer.append(RecordKind.ENVELOPE, envelope_row(envelope, self._wall))

    def record_history(self, point: HistoryPoint) -> None:
        """One GPU's minute snapshot (buffered like every other record)."""
        self._buffer.append(RecordKind.HISTORY, history_row(point))

    async def flush(self) -> None:
        """Wait until everything recorded so far is committed (or dropped to make room)."""
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._buffer.wait_for(done)
        self._buffer.settle()
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
        return await read_envelopes(self._db)

    async def history(
        self, gpu: int | None, since: float, step: float = 60.0
    ) -> list[HistoryPoint]:
        """Snapshots since `since` (wall clock), the last one of each `step` seconds; none
        while the file is not open."""
        if self._db is None:
            return []
        return await read_history(self._db, gpu, since, step)

    async def prune_history(self, before: float) -> int:
        """Delete snapshots older than `before` (wall clock); how many went."""
        async with self._write_lock:
            if self._db is None:
                return 0
            return await delete_history(self._db, before)

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
        if not self._buffer.waiting:
            return True
        db = self._db
        batch = self._buffer.take()
        try:
            rows = await build_rows(batch, self._unwritable)
            self._buffer.inflight = [record for record, _ in rows]
            try:
                # One statement per kind of row for the whole batch, in one transaction.
                await insert_batch(db, rows)
            except Exception as exc:
                if refused(exc):
                    raise
                # One record the database cannot take: the others must not wait on it.
                await db.rollback()
                gone = await insert_each(db, rows, self._unwritable)
                self._buffer.inflight = [r for r in self._buffer.inflight if r[0] not in gone]
            await db.commit()
        except Exception as exc:
            if not refused(exc):
                raise
            with contextlib.suppress(Exception):
                await db.rollback()
            self._buffer.requeue()
            self._failed(exc)
            self._buffer.settle()
            return False
        self._buffer.inflight = []
        if self.last_error is not None:
            log.info(
                "store: writes to %s resumed after %d failed attempts; %d records dropped",
                self.path,
                self.write_failures,
                sum(self.dropped.values()),
            )
        self.last_error = None
        self._retry = 0.0
        self._buffer.settle()
        return True

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
        self._buffer.requeue()
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
        self._buffer.settle()
