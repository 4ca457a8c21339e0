"""Runtime lifecycles: a process runtime is stopped, starting, up, asleep or stopping.

The core owns the state; the gate carries out what the core decides through one small
lifecycle interface (the runtime's process control) and reports back what happened:

    STOPPED --Start--> STARTING --UP--> UP --Stop--> STOPPING --STOPPED--> STOPPED
    ASLEEP  --Wake---> STARTING --UP--> UP --Sleep-> STOPPING --ASLEEP---> ASLEEP

A start that fails goes back to where it came from (a failed wake leaves the runtime
asleep) and counts for the runtime's backoff; a process that ends on its own (EXITED) is
stopped and counts too; one that ends as a request switches its model (ENDED_SWITCHING:
the model it was asked to load did not load) is stopped and does not. A runtime the gate
finds already running, asleep or stopped (at its own start, or before a start) is
recorded as found (FOUND_UP, FOUND_ASLEEP, FOUND_STOPPED).

Stopped is a state, not a failure: a runtime the gate stopped (an eviction, its ttl) or has
not started yet is `stopped_on_purpose`; one whose last start failed or that ended on its
own is `failing` until a start succeeds.

Everything here is pure: time is an argument, nothing awaits.
"""

from __future__ import annotations

import enum

import attrs

BACKOFF_BASE = 1.0
BACKOFF_MAX = 300.0
STABLE_AFTER = 60.0
"""A process that ran this long before it ended was not crash-looping: its backoff resets."""


class LifeState(enum.Enum):
    STOPPED = "stopped"
    STARTING = "starting"
    """Started or woken, not yet answering."""
    UP = "up"
    ASLEEP = "asleep"
    """Its process lives and keeps a residual (its context); its model's memory is given back."""
    STOPPING = "stopping"
    """Being stopped or put to sleep for an eviction."""


class LifeReport(enum.Enum):
    """What the lifecycle interface reports after carrying out an effect, or on its own."""

    UP = "up"
    """Started or woken, and answering."""
    START_FAILED = "start_failed"
    STOPPED = "stopped"
    ASLEEP = "asleep"
    STOP_FAILED = "stop_failed"
    """Asked to stop or sleep, it could not: it is taken as still up."""
    EXITED = "exited"
    """It ended on its own (a crash, an exit nobody asked for)."""
    ENDED_SWITCHING = "ended_switching"
    """It ended while it switched its model at a request, as the runtime ends when the
    model does not load (whisper-server's /load of a file that is no model): the request's
    doing, not a crash loop. Stopped, and not failing: its next start loads the model it
    started with, at once (no backoff counted)."""
    FOUND_UP = "found_up"
    FOUND_ASLEEP = "found_asleep"
    FOUND_STOPPED = "found_stopped"


class Eviction(enum.Enum):
    """How a runtime's memory is given back."""

    UNLOAD = "unload"
    """The runtime unloads the model and keeps running (no lifecycle)."""
    STOP = "stop"
    SLEEP = "sleep"


@attrs.define
class StartBackoff:
    """Starts of one runtime after failures: 1 s, 2 s, 4 s ... up to 5 minutes."""

    failures: int = 0
    not_before: float = 0.0
    ready_at: float | None = None

    def failed(self, now: float) -> float:
        """Count a failed start or a crash; returns the seconds until the next start."""
        if self.ready_at is not None and now - self.ready_at >= STABLE_AFTER:
            self.failures = 0
        self.ready_at = None
        self.failures += 1
        delay = min(BACKOFF_MAX, BACKOFF_BASE * 2 ** min(self.failures - 1, 30))
        self.not_before = now + delay
        return delay

    def ready(self, now: float) -> None:
        """It answers; failures are forgotten once it stays up (`STABLE_AFTER`)."""
        self.ready_at = now

    def remaining(self, now: float) -> float:
        return max(0.0, self.not_before - now)


@attrs.define
class Life:
    """One runtime's lifecycle."""

    consumer: str
    eviction: Eviction
    state: LifeState = LifeState.STOPPED
    since: float = 0.0
    backoff: StartBackoff = attrs.Factory(StartBackoff)
    start_lease: int | None = None
    """The PROCESS lease its current start runs under."""
    waking: bool = False
    """The current start is a wake (a failure leaves it asleep)."""
    failing: bool = False
    """Its last start failed, or it ended on its own, and no start succeeded since."""

    def move(self, state: LifeState, now: float) -> None:
        if state is not self.state:
            self.state, self.since = state, now

    @property
    def stopped_on_purpose(self) -> bool:
        """Its process is not there because the gate stopped it (or is stopping it, or has
        not started it yet): nothing failed."""
        return self.state in (LifeState.STOPPED, LifeState.STOPPING) and not self.failing


@attrs.frozen
class ReportOutcome:
    """What a report changed, for the core to act on in the books."""

    before: LifeState
    after: LifeState
    start_lease: int | None = None
    """The start lease the report ends (UP: it becomes the resident; failed: released)."""
    retry_after: float | None = None
    """A failed start or an exit: the seconds until the next start may be tried."""


class Lifecycles:
    """The lifecycles of the runtimes that have one, by consumer."""

    def __init__(self) -> None:
        self.lives: dict[str, Life] = {}

    def register(self, consumer: str, eviction: Eviction, now: float) -> None:
        """A runtime with a lifecycle: stopped until found otherwise or started."""
        if consumer not in self.lives or self.lives[consumer].eviction is not eviction:
            self.lives[consumer] = Life(consumer, eviction, since=now)

    def get(self, consumer: str) -> Life | None:
        return self.lives.get(consumer)

    def eviction(self, consumer: str) -> Eviction:
        life = self.lives.get(consumer)
        return Eviction.UNLOAD if life is None else life.eviction

    def evicting(self, consumer: str, now: float) -> Eviction:
        """An eviction of the runtime's memory was decided: it is stopping (or going to
        sleep); how it is carried out."""
        life = self.lives.get(consumer)
        if life is None:
            return Eviction.UNLOAD
        life.move(LifeState.STOPPING, now)
        return life.eviction

    def backoff_remaining(self, consumer: str, now: float) -> float:
        life = self.lives.get(consumer)
        return 0.0 if life is None else life.backoff.remaining(now)

    def start(self, consumer: str, lease_id: int, now: float) -> LifeState | None:
        """A start was admitted under `lease_id`: the state it starts from (STOPPED: a
        start, ASLEEP: a wake), or None when nothing is to be done (starting already, up,
        or not a runtime with a lifecycle)."""
        life = self.lives.get(consumer)
        if life is None or life.state not in (LifeState.STOPPED, LifeState.ASLEEP):
            return None
        before = life.state
        life.waking = before is LifeState.ASLEEP
        life.start_lease = lease_id
        life.move(LifeState.STARTING, now)
        return before

    def report(self, consumer: str, report: LifeReport, now: float) -> ReportOutcome | None:
        """What the lifecycle interface saw; None for a runtime without a lifecycle."""
        life = self.lives.get(consumer)
        if life is None:
            return None
        before = life.state
        lease = life.start_lease
        retry: float | None = None
        if report in (LifeReport.UP, LifeReport.FOUND_UP):
            if report is LifeReport.UP:
                life.backoff.ready(now)
            life.move(LifeState.UP, now)
            life.failing = False
        elif report is LifeReport.START_FAILED:
            retry = life.backoff.failed(now)
            life.move(LifeState.ASLEEP if life.waking else LifeState.STOPPED, now)
            life.failing = True
        elif report is LifeReport.EXITED:
            retry = life.backoff.failed(now)
            life.move(LifeState.STOPPED, now)
            life.failing = True
        elif report is LifeReport.ENDED_SWITCHING:
            life.move(LifeState.STOPPED, now)
            life.failing = False
        elif report in (LifeReport.STOPPED, LifeReport.FOUND_STOPPED):
            # A stop the gate asked for ends a failure too; a probe that finds the process
            # stopped after a crash does not.
            if report is LifeReport.STOPPED:
                life.failing = False
            life.move(LifeState.STOPPED, now)
        elif report in (LifeReport.ASLEEP, LifeReport.FOUND_ASLEEP):
            life.move(LifeState.ASLEEP, now)
        elif report is LifeReport.STOP_FAILED and before is LifeState.STOPPING:
            life.move(LifeState.UP, now)
        if life.state is not LifeState.STARTING:
            life.start_lease, life.waking = None, False
        ended = lease if before is LifeState.STARTING and life.state is not before else None
        return ReportOutcome(before, life.state, ended, retry)
