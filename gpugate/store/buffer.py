"""The records a store has not committed yet: bounded, the oldest dropped when it is full."""

from __future__ import annotations

import asyncio
import collections

from gpugate.store.schema import MinuteKey, MinuteTally, Record, RecordKind


class RecordBuffer:
    """The records waiting for the writer in the order they came, the batch it is writing,
    and the flushes waiting on them.

    When it is full the **oldest** record is dropped, because the newest ones describe the
    state an operator will look at (and a newer envelope supersedes an older one); every
    drop is counted by kind (`gpugate_store_dropped_total`).
    """

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.waiting: collections.deque[Record] = collections.deque()
        """Records not taken by the writer yet."""
        self.inflight: list[Record] = []
        """The batch being written."""
        self._seq = 0
        self._minutes: dict[MinuteKey, MinuteTally] = {}
        """The minute tallies whose records are still in the buffer."""
        self._flushed: list[tuple[int, asyncio.Future[None]]] = []
        self.dropped: dict[RecordKind, int] = dict.fromkeys(RecordKind, 0)
        """Records given up, by kind: the buffer was full, or the gate stopped first."""

    @property
    def buffered(self) -> int:
        """Records not yet committed."""
        return len(self.waiting) + len(self.inflight)

    def append(self, kind: RecordKind, params: tuple[object, ...] | MinuteTally) -> None:
        if len(self.waiting) >= self.limit:
            self.drop_oldest()
        self._seq += 1
        self.waiting.append((self._seq, kind, params))

    def drop_oldest(self) -> None:
        _, kind, record = self.waiting.popleft()
        self.dropped[kind] += 1
        if isinstance(record, MinuteTally) and self._minutes.get(record.key) is record:
            del self._minutes[record.key]

    def count_minute(self, key: MinuteKey, held: float) -> None:
        """A routine lease, counted in its minute's tally (a record of its own when the
        minute has none waiting)."""
        tally = self._minutes.get(key)
        if tally is None:
            tally = self._minutes[key] = MinuteTally(key)
            self.append(RecordKind.LEASE_MINUTE, tally)
        tally.add(held)

    def take(self) -> list[Record]:
        """The records waiting, now the batch in flight."""
        batch = list(self.waiting)
        self.waiting.clear()
        # Tallies taken now are not added to any more: later leases start new ones.
        self._minutes.clear()
        self.inflight = batch
        return batch

    def requeue(self) -> None:
        """Put the batch being written back at the front of the buffer."""
        if self.inflight:
            self.waiting.extendleft(reversed(self.inflight))
            self.inflight = []
            while len(self.waiting) > self.limit:
                self.drop_oldest()

    def give_up(self) -> int:
        """Drop (and count) every record not committed; how many there were."""
        left = [*self.inflight, *self.waiting]
        for _, kind, _ in left:
            self.dropped[kind] += 1
        self.waiting.clear()
        self.inflight = []
        return len(left)

    def wait_for(self, done: asyncio.Future[None]) -> None:
        """Set `done` once every record appended so far is committed or dropped."""
        self._flushed.append((self._seq, done))

    def settle(self) -> None:
        """Wake the flushes whose records are all committed or dropped."""
        pending = self.inflight[0][0] if self.inflight else None
        if pending is None and self.waiting:
            pending = self.waiting[0][0]
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
