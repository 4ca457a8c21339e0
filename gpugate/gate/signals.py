"""Each consumer's signals: the listing that keeps the books in step with what its runtime
holds, and what says the runtime is there and answering (its listing, its health route, or
its process; `Health.signal`).

A listed runtime is listed every interval, and at once when something changed behind the
books (`want_reconcile`); a runtime with a health route or a process is probed on the same
interval. Every call is bounded by the consumer's `timeouts.control`; a failing one keeps
the last good answer and backs off up to LISTING_BACKOFF_MAX. `/gate/v1/health` reads the
age of each consumer's signal (`consumer_health`).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Sequence
from typing import Protocol

import attrs

from gpugate.config.model import Consumer
from gpugate.core.effects import Effect
from gpugate.core.failures import Failure
from gpugate.core.residents import ResidentState
from gpugate.core.state import GateCore, ListedModel
from gpugate.gate.envelopes import EnvelopeBook
from gpugate.gate.link import Link
from gpugate.gate.upstream import Backoff, upstream_failure
from gpugate.runtimes.base import HealthSignal, NotSupported

RECONCILE_INTERVAL = 2.0
LISTING_BACKOFF_MAX = 10.0
"""The longest a failing listing or health loop waits before it asks again."""
PROBED = (HealthSignal.HEALTH_ROUTE, HealthSignal.PROCESS)
"""The signals the gate asks for on their own (a listing is asked by its listing loop)."""


class UnhealthyAnswer(Exception):
    """The runtime answered its health route, but not as a healthy one does."""


@attrs.frozen
class SignalSeen:
    """When a consumer's health signal last answered well, and what it said."""

    at: float
    stopped: bool = False
    """PROCESS: its process was not running (stopped or evicted; it starts on demand)."""


@attrs.frozen
class ConsumerHealth:
    """One consumer's health as `/gate/v1/health` shows it."""

    consumer: str
    signal: HealthSignal
    age: float | None
    """Seconds since the signal last answered well; None: it never did, or there is none."""
    limit: float | None
    """How old it may be and still count as fresh; None for an unobserved consumer."""
    stopped: bool = False

    @property
    def fresh(self) -> bool | None:
        """Whether the signal is young enough; None when the consumer has no signal."""
        if self.signal is HealthSignal.UNOBSERVED:
            return None
        return self.age is not None and self.limit is not None and self.age <= self.limit

    @property
    def ok(self) -> bool:
        # A consumer that cannot be observed says nothing against the gate.
        return self.fresh is not False


class SignalReports(Protocol):
    """What the signals hand the gate: the core's effects of a listing, and their failures."""

    def apply(self, effects: Sequence[Effect]) -> None: ...

    def loop_failed(self, loop: str, failure: Failure) -> None: ...

    def probe_failed(self, consumer: str, message: str) -> None: ...


class ConsumerSignals:
    """The listings and health probes of the gate's links, and their ages."""

    def __init__(
        self,
        core: GateCore,
        links: dict[str, Link],
        envelopes: EnvelopeBook,
        clock: Callable[[], float],
        interval: float,
        reports: SignalReports,
    ) -> None:
        self.core = core
        self.links = links
        self.envelopes = envelopes
        self.clock = clock
        self.interval = interval
        self.reports = reports
        self._listed_at: dict[str, float] = {}
        self._seen: dict[str, SignalSeen] = {}

    def open(self) -> None:
        """Open each link's connections. Every signal gets its first bound from now, not
        from a first answer."""
        for link in self.links.values():
            name = link.consumer.name
            self._listed_at[name] = self.clock()
            self._seen[name] = SignalSeen(self.clock())
            link.open()

    def start(self, spawn: Callable[..., None]) -> None:
        """Start the listing and health loops."""
        for link in self.links.values():
            if link.runtime.inventory is not None:
                spawn(self._reconcile_loop(link), f"reconcile-{link.consumer.name}")
            if link.runtime.health.signal in PROBED:
                spawn(self._health_loop(link), f"health-{link.consumer.name}")

    # -- listings ------------------------------------------------------------------------

    def want_reconcile(self, consumer: str) -> None:
        """Something changed behind the books (an unload request): list residents soon."""
        link = self.links.get(consumer)
        if link is not None:
            link.reconcile_wanted.set()

    async def reconcile(self, link: Link) -> None:
        """List what the runtime has loaded and fold it into the books."""
        assert link.session is not None
        inventory = link.runtime.inventory
        if inventory is None:
            raise NotSupported(f"{link.consumer.name} cannot list what it holds")
        asked_at = self.clock()
        async with asyncio.timeout(link.consumer.timeouts.control):
            loaded = await inventory.listing(link.session)
        settings = link.runtime.settings
        listed = []
        for model in loaded:
            residency = settings.residency(model.name)
            listed.append(
                ListedModel(
                    model=model.name,
                    bytes=model.size_vram if model.sized else None,
                    size=max(model.size, model.size_vram),
                    priority=settings.model_priority(model.name),
                    policy=residency.policy,
                    idle_ttl=residency.idle_ttl,
                    reload_seconds=settings.reload_seconds(model.name, model.size),
                )
            )
        consumer = link.consumer
        self.reports.apply(
            self.core.reconcile(
                consumer.name, consumer.cards, listed, asked_at=asked_at, now=self.clock()
            )
        )
        self._learn_envelopes(link, listed)
        self._listed_at[consumer.name] = self.clock()

    def _learn_envelopes(self, link: Link, listed: list[ListedModel]) -> None:
        # Only what the runtime said: its own estimate is not a measurement.
        sizes = {m.model: m.size for m in listed if m.bytes is not None}
        cards = set(link.consumer.cards)
        for resident in self.core.residents():
            # The whole model's size is its measure: a split model's parts share it.
            key = resident.key.whole
            if resident.gpu not in cards:
                continue
            size = sizes.get(key.model)
            if (
                key.consumer != link.consumer.name
                or size is None
                or resident.out_of_band
                or resident.state is not ResidentState.RESIDENT
            ):
                continue
            self.envelopes.learn_listed(key, size)

    async def _reconcile_loop(self, link: Link) -> None:
        name = link.consumer.name
        backoff = Backoff(self.interval, max(self.interval, LISTING_BACKOFF_MAX))
        while True:
            try:
                await self.reconcile(link)
            except Exception as exc:
                # The books keep the last good listing; a failing runtime is asked less
                # often, and a wish for a listing does not cut the wait short.
                what = f"cannot list what {name} has loaded"
                failure = upstream_failure(link.consumer, exc, what)
                self.reports.loop_failed(f"listing-{name}", failure)
                await asyncio.sleep(backoff.failed())
                link.reconcile_wanted.clear()
                continue
            backoff.succeeded()
            # asyncio.timeout, not wait_for: on 3.11 wait_for swallows a cancellation that
            # arrives as the event is set, and the gate could not stop this loop.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.interval):
                    await link.reconcile_wanted.wait()
            link.reconcile_wanted.clear()

    # -- health --------------------------------------------------------------------------

    async def probe(self, link: Link) -> None:
        """Ask a consumer's health signal once (not its listing: that is `reconcile`)."""
        assert link.session is not None
        health = link.runtime.health
        lifecycle = link.runtime.lifecycle
        control = lifecycle.control if lifecycle is not None else None
        stopped = False
        async with asyncio.timeout(link.consumer.timeouts.control):
            if health.signal is HealthSignal.PROCESS and control is not None:
                stopped = not await control.is_running()
            # A stopped process has no route to ask; it is started on the next request.
            if not stopped and not await health.check(link.session):
                raise UnhealthyAnswer(f"{link.consumer.name} answered its health route unwell")
        self._seen[link.consumer.name] = SignalSeen(self.clock(), stopped)

    async def _health_loop(self, link: Link) -> None:
        name = link.consumer.name
        backoff = Backoff(self.interval, max(self.interval, LISTING_BACKOFF_MAX))
        while True:
            try:
                await self.probe(link)
            except Exception as exc:
                # Health reads the signal's age; the log says why it is getting old.
                self.reports.probe_failed(name, f"{name}'s health signal did not answer: {exc!r}")
                await asyncio.sleep(backoff.failed())
                continue
            backoff.succeeded()
            await asyncio.sleep(self.interval)

    def listing_age(self, consumer: str, now: float) -> float | None:
        """Seconds since the consumer's runtime last answered a listing (None: not listed)."""
        at = self._listed_at.get(consumer)
        return None if at is None else max(0.0, now - at)

    def listing_stale_after(self, consumer: Consumer) -> float:
        """How old a consumer's last good listing may be before health turns bad."""
        return 3 * self.interval + consumer.timeouts.control

    def signal_stale_after(self, link: Link) -> float:
        """How old a consumer's health signal may be before health turns bad: a listing's
        bound, and for a process also its start timeout (its health route is silent while
        it starts)."""
        bound = self.listing_stale_after(link.consumer)
        control = link.consumer.control
        if link.runtime.health.signal is HealthSignal.PROCESS and control is not None:
            bound += control.start_timeout
        return bound

    def consumer_health(self, link: Link, now: float) -> ConsumerHealth:
        """The consumer's health from the signal its runtime has."""
        name = link.consumer.name
        signal = link.runtime.health.signal
        if signal is HealthSignal.UNOBSERVED:
            return ConsumerHealth(name, signal, None, None)
        if signal is HealthSignal.LISTING:
            age = self.listing_age(name, now)
            return ConsumerHealth(name, signal, age, self.listing_stale_after(link.consumer))
        seen = self._seen.get(name)
        age = None if seen is None else max(0.0, now - seen.at)
        stopped = seen is not None and seen.stopped
        return ConsumerHealth(name, signal, age, self.signal_stale_after(link), stopped)
