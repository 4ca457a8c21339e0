"""The store's schema: numbered migrations, the kinds of record and their rows."""

from __future__ import annotations

import enum
from collections.abc import Callable, Sequence

import attrs

from gpugate.core.effects import Event
from gpugate.core.tickets import Lease, LeaseScope

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
    # 4: requests served from a resident model without waiting, counted by the minute.
    """
    CREATE TABLE lease_minutes (
        minute REAL NOT NULL,
        consumer TEXT NOT NULL,
        model TEXT NOT NULL,
        options TEXT NOT NULL,
        gpu INTEGER NOT NULL,
        priority TEXT NOT NULL,
        outcome TEXT NOT NULL,
        leases INTEGER NOT NULL,
        held_total REAL NOT NULL,
        held_max REAL NOT NULL,
        PRIMARY KEY (minute, consumer, model, options, gpu, priority, outcome)
    ) WITHOUT ROWID;
    """,
)


class RecordKind(enum.Enum):
    """What a buffered record is (the label of the store's metrics)."""

    EVENT = "event"
    LEASE = "lease"
    LEASE_MINUTE = "lease_minute"
    ENVELOPE = "envelope"
    HISTORY = "history"


INSERT = {
    RecordKind.EVENT: "INSERT INTO events (wall, kind, consumer, model, gpu, bytes,"
    " failure_class, detail) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
    RecordKind.LEASE: "INSERT INTO leases (id, started, consumer, model, options, gpu,"
    " priority, bytes, loaded, waited, held, outcome) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
    RecordKind.LEASE_MINUTE: "INSERT INTO lease_minutes (minute, consumer, model, options, gpu,"
    " priority, outcome, leases, held_total, held_max) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
    " ON CONFLICT (minute, consumer, model, options, gpu, priority, outcome) DO UPDATE SET"
    " leases = leases + excluded.leases, held_total = held_total + excluded.held_total,"
    " held_max = max(held_max, excluded.held_max)",
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


def event_row(event: Event, wall: float) -> tuple[object, ...]:
    """An event's row in the `events` table (`wall`: when it was recorded)."""
    failure = event.failure.failure_class.value if event.failure else None
    return (
        wall,
        event.kind.value,
        event.consumer,
        event.model,
        event.gpu,
        event.bytes,
        failure,
        event.detail,
    )


def envelope_row(envelope: MeasuredEnvelope, wall: Callable[[], float]) -> tuple[object, ...]:
    """A measured envelope's row in the `envelopes` table (`wall` gives the time of a
    measurement that has none)."""
    return (
        envelope.consumer,
        envelope.model,
        envelope.options,
        envelope.bytes,
        envelope.measured if envelope.measured is not None else wall(),
        envelope.scale,
        envelope.runtime_version,
    )


def history_row(point: HistoryPoint) -> tuple[object, ...]:
    """A GPU's minute snapshot's row in the `history` table."""
    return (
        *(getattr(point, name) for name in HISTORY_COLUMNS[:-2]),
        int(point.pressure),
        point.rows,
    )


MinuteKey = tuple[float, str, str, str, int, str, str]
"""(minute, consumer, model, options, gpu, priority, outcome) of a `lease_minutes` row."""


def routine(lease: Lease) -> bool:
    """A request served from a resident model without waiting: counted by the minute in
    `lease_minutes`, not one row each (a busy listener serves thousands a second)."""
    return not lease.loads and not lease.waited and lease.demand.scope is LeaseScope.REQUEST


def minute_key(lease: Lease, outcome: str, wall: float) -> MinuteKey:
    """The `lease_minutes` row a routine lease that ended at `wall` is counted in."""
    demand = lease.demand
    key = demand.key
    return (
        wall - wall % 60.0,
        key.consumer,
        key.model,
        key.options,
        demand.gpu,
        demand.priority.label,
        outcome,
    )


class MinuteTally:
    """Leases of one `lease_minutes` row gathered since the last write (updated in place
    while its record waits in the buffer)."""

    __slots__ = ("held_max", "held_total", "key", "leases")

    def __init__(self, key: MinuteKey) -> None:
        self.key = key
        self.leases = 0
        self.held_total = 0.0
        self.held_max = 0.0

    def add(self, held: float) -> None:
        self.leases += 1
        self.held_total += held
        if held > self.held_max:
            self.held_max = held

    def row(self) -> tuple[object, ...]:
        return (*self.key, self.leases, self.held_total, self.held_max)


Record = tuple[int, RecordKind, "tuple[object, ...] | MinuteTally"]
"""A buffered record: its sequence number, its kind and its row — or for a lease (lease,
held, outcome, wall time), which the writer turns into its row, or a minute's tally,
which is added to until the writer takes it."""


def row_of(kind: RecordKind, record: tuple[object, ...] | MinuteTally) -> tuple[object, ...]:
    """The row a buffered record is written as, its text storable."""
    if isinstance(record, MinuteTally):
        row = record.row()
    elif kind is RecordKind.LEASE:
        row = lease_row(*record)  # type: ignore[arg-type]
    else:
        row = record
    return storable(row)


def storable(row: tuple[object, ...]) -> tuple[object, ...]:
    """The row with every text value encodable as UTF-8 (the row itself when it already is).

    Clients can send lone surrogates (a JSON "\\ud800" decodes to one, and Ollama and
    ComfyUI keep them in model names and messages); SQLite cannot bind such a string. Each
    is written as its escape, the six characters `\\ud800` (backslashreplace): a reader
    gets valid text and can still tell which code point was sent. surrogateescape would
    store bytes that are not UTF-8, which readers of the file then fail to decode.
    """
    # isascii is O(1) on CPython: the common row costs a type check per value.
    for value in row:
        if type(value) is str and not value.isascii():
            return tuple(_text(v) if isinstance(v, str) else v for v in row)
    return row


def _text(value: str) -> str:
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return value.encode("utf-8", "backslashreplace").decode("utf-8")
    return value
