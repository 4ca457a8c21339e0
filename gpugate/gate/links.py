"""Links: each fronted consumer's adapter and upstream connection pool, the listings that
keep the books in step with what the runtimes hold, and what a model will take."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING

import aiohttp
import attrs

from gpugate.config.model import Config, Consumer
from gpugate.core.effects import Effect
from gpugate.core.failures import Failure
from gpugate.core.planner import PlannerSettings
from gpugate.core.pressure import ReserveSettings
from gpugate.core.residents import ResidentKey, ResidentState
from gpugate.core.state import CoreSettings, GateCore, ListedModel
from gpugate.gate.upstream import Backoff, upstream_failure
from gpugate.runtimes.base import HealthSignal, RuntimeAdapter
from gpugate.store.db import MeasuredEnvelope, Store

RECONCILE_INTERVAL = 2.0
UPSTREAM_SKIP_AUTO_HEADERS = ("User-Agent", "Accept", "Accept-Encoding", "Content-Type")
"""Headers aiohttp would add on its own to forwarded requests: the client's (or none) go
up instead. Set on the session, which resolves them once rather than per request."""
ESTIMATE_TTL = 60.0
LISTING_BACKOFF_MAX = 10.0
"""The longest a failing listing or health loop waits before it asks again."""

AdapterFactory = Callable[[Consumer], RuntimeAdapter | None]


class GateFailure(Exception):
    """A request cannot be admitted; carries the failure to tell its client."""

    def __init__(self, failure: Failure) -> None:
        super().__init__(failure.message)
        self.failure = failure


@attrs.define
class Link:
    """A fronted consumer with its adapter and its upstream connection pool."""

    consumer: Consumer
    adapter: RuntimeAdapter
    session: aiohttp.ClientSession | None = None
    reconcile_wanted: asyncio.Event = attrs.field(factory=asyncio.Event)
    jobs_live: asyncio.Event = attrs.field(factory=asyncio.Event)
    """Set when a tracked job starts: the job loop wakes."""
    seen_holding: bool = False
    """NVML showed the consumer holding memory while its jobs were live."""
    idle_bytes: int | None = None
    """What NVML showed for the consumer while the books held nothing for it."""

    def open(self) -> None:
        """Open the upstream connection pool."""
        self.session = aiohttp.ClientSession(
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=self.consumer.timeouts.connect),
            auto_decompress=False,
            skip_auto_headers=UPSTREAM_SKIP_AUTO_HEADERS,
            connector=aiohttp.TCPConnector(limit=0, force_close=not self.adapter.pool_connections),
        )


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


def make_links(config: Config, adapters: AdapterFactory) -> dict[str, Link]:
    """A link for every consumer whose runtime has an adapter."""
    links = {}
    for consumer in config.consumers:
        adapter = adapters(consumer)
        if adapter is not None:
            links[consumer.name] = Link(consumer, adapter)
    return links


def core_settings(config: Config, links: Mapping[str, Link]) -> CoreSettings:
    """Resolve the configuration into what the decision core needs; `links`: the fronted
    consumers' (their adapters say which are reconcilable)."""
    budget = config.budget
    reserve = ReserveSettings(budget.reserve, max(budget.reserve, budget.reserve_max))
    by_gpu = {
        g.index: ReserveSettings(g.reserve, max(g.reserve, budget.reserve_max))
        for g in config.gpus
        if g.reserve is not None
    }
    return CoreSettings(
        reserve=reserve,
        reserve_by_gpu=by_gpu,
        max_wait={c.priority: c.max_wait for c in config.classes},
        consumer_gpus={c.name: c.cards for c in config.consumers},
        queue_limit={c.name: c.queue_limit for c in config.consumers},
        stale_after=budget.stale_after,
        planner=PlannerSettings(),
        reconcilable=frozenset(name for name, link in links.items() if link.adapter.reconcilable),
        preempt={c.name: frozenset(c.preempt) for c in config.consumers if c.preempt},
    )


class LinkWork:
    """The gate's side of its links (a part of `Gate`)."""

    core: GateCore
    clock: Callable[[], float]
    links: dict[str, Link]
    listing_interval: float
    store: Store | None
    _measured: dict[ResidentKey, int]
    _estimates: dict[tuple[str, str, str], tuple[float, int | None]]
    _listed_at: dict[str, float]
    _signal_seen: dict[str, SignalSeen]

    if TYPE_CHECKING:  # Gate provides these

        def _apply(self, effects: Sequence[Effect], *, timers: bool = True) -> None: ...

        def loop_failed(self, loop: str, failure: Failure) -> None: ...

        def probe_failed(self, consumer: str, message: str) -> None: ...

    def want_reconcile(self, consumer: str) -> None:
        """Something changed behind the books (an unload request): list residents soon."""
        link = self.links.get(consumer)
        if link is not None:
            link.reconcile_wanted.set()

    def known_envelope(self, link: Link, model: str, options: str) -> int | None:
        """Configured or measured bytes for a model, when the gate has them without asking."""
        configured = link.adapter.configured_envelope(model)
        if configured is not None:
            return configured
        return self._measured.get(ResidentKey(link.consumer.name, model, options))

    def envelope_known(self, link: Link, model: str, options: str) -> tuple[int, str] | None:
        """The bytes a request for the model would lease, as far as the gate knows them
        without asking the runtime, and where they come from: `configured`, `measured`, or
        an `estimate` made in the last minute. None: only the runtime could say."""
        configured = link.adapter.configured_envelope(model)
        if configured is not None:
            return configured, "configured"
        measured = self._measured.get(ResidentKey(link.consumer.name, model, options))
        if measured is not None:
            return measured, "measured"
        cached = self._estimates.get((link.consumer.name, model, options))
        fresh = cached is not None and self.clock() - cached[0] < ESTIMATE_TTL
        if fresh and cached is not None and cached[1] is not None:
            return cached[1], "estimate"
        return None

    def measured_envelope(self, key: ResidentKey) -> int | None:
        """What the gate measured of a model (or a process's memory) once it was loaded."""
        return self._measured.get(key)

    def learn_envelope(self, key: ResidentKey, nbytes: int) -> None:
        """Keep what a loaded model (a running process) holds as its measured envelope."""
        if nbytes <= 0 or self._measured.get(key) == nbytes:
            return
        self._measured[key] = nbytes
        if self.store is not None:
            self.store.record_envelope(
                MeasuredEnvelope(key.consumer, key.model, key.options, nbytes)
            )

    async def envelope(self, link: Link, model: str, options: str) -> int | None:
        """Bytes to lease for a model: configured, else measured, else estimated.

        None when the runtime does not know the model (it answers 404 without loading).
        """
        known = self.known_envelope(link, model, options)
        if known is not None:
            return known
        adapter = link.adapter
        cache_key = (link.consumer.name, model, options)
        cached = self._estimates.get(cache_key)
        now = self.clock()
        if cached is not None and now - cached[0] < ESTIMATE_TTL:
            return cached[1]
        assert link.session is not None
        try:
            async with asyncio.timeout(link.consumer.timeouts.control):
                estimate = await adapter.estimate(link.session, model, options)
        except Exception as exc:
            failure = upstream_failure(link.consumer, exc, f"cannot size {model}", model=model)
            raise GateFailure(failure) from exc
        if estimate is not None:
            # Not an unknown model: one pulled a moment later must be sized, not passed.
            self._estimates[cache_key] = (now, estimate)
        return estimate

    async def reconcile(self, link: Link) -> None:
        """List what the runtime has loaded and fold it into the books."""
        assert link.session is not None
        asked_at = self.clock()
        async with asyncio.timeout(link.consumer.timeouts.control):
            loaded = await link.adapter.listing(link.session)
        adapter = link.adapter
        listed = []
        for model in loaded:
            residency = adapter.residency(model.name)
            listed.append(
                ListedModel(
                    model=model.name,
                    bytes=model.size_vram if model.sized else None,
                    size=max(model.size, model.size_vram),
                    priority=adapter.model_priority(model.name),
                    policy=residency.policy,
                    idle_ttl=residency.idle_ttl,
                    reload_seconds=adapter.reload_seconds(model.name, model.size),
                )
            )
        self._apply(
            self.core.reconcile(
                link.consumer.name, link.consumer.cards, listed, asked_at=asked_at, now=self.clock()
            )
        )
        self._learn_envelopes(link, listed)
        self._listed_at[link.consumer.name] = self.clock()

    def listing_age(self, consumer: str, now: float) -> float | None:
        """Seconds since the consumer's runtime last answered a listing (None: not listed)."""
        at = self._listed_at.get(consumer)
        return None if at is None else max(0.0, now - at)

    def listing_stale_after(self, consumer: Consumer) -> float:
        """How old a consumer's last good listing may be before health turns bad."""
        return 3 * self.listing_interval + consumer.timeouts.control

    def signal_stale_after(self, link: Link) -> float:
        """How old a consumer's health signal may be before health turns bad: a listing's
        bound, and for a process also its start timeout (its health route is silent while
        it starts)."""
        bound = self.listing_stale_after(link.consumer)
        control = link.consumer.control
        if link.adapter.health_signal is HealthSignal.PROCESS and control is not None:
            bound += control.start_timeout
        return bound

    def consumer_health(self, link: Link, now: float) -> ConsumerHealth:
        """The consumer's health from the signal its runtime has."""
        name = link.consumer.name
        signal = link.adapter.health_signal
        if signal is HealthSignal.UNOBSERVED:
            return ConsumerHealth(name, signal, None, None)
        if signal is HealthSignal.LISTING:
            age = self.listing_age(name, now)
            return ConsumerHealth(name, signal, age, self.listing_stale_after(link.consumer))
        seen = self._signal_seen.get(name)
        age = None if seen is None else max(0.0, now - seen.at)
        stopped = seen is not None and seen.stopped
        return ConsumerHealth(name, signal, age, self.signal_stale_after(link), stopped)

    async def probe(self, link: Link) -> None:
        """Ask a consumer's health signal once (not its listing: that is `reconcile`)."""
        assert link.session is not None
        adapter = link.adapter
        stopped = False
        async with asyncio.timeout(link.consumer.timeouts.control):
            if adapter.health_signal is HealthSignal.PROCESS and adapter.process is not None:
                stopped = not await adapter.process.is_running()
            # A stopped process has no route to ask; it is started on the next request.
            if not stopped and not await adapter.health(link.session):
                raise UnhealthyAnswer(f"{link.consumer.name} answered its health route unwell")
        self._signal_seen[link.consumer.name] = SignalSeen(self.clock(), stopped)

    async def _health_loop(self, link: Link) -> None:
        name = link.consumer.name
        backoff = Backoff(self.listing_interval, max(self.listing_interval, LISTING_BACKOFF_MAX))
        while True:
            try:
                await self.probe(link)
            except Exception as exc:
                # Health reads the signal's age; the log says why it is getting old.
                self.probe_failed(name, f"{name}'s health signal did not answer: {exc!r}")
                await asyncio.sleep(backoff.failed())
                continue
            backoff.succeeded()
            await asyncio.sleep(self.listing_interval)

    def _learn_envelopes(self, link: Link, listed: list[ListedModel]) -> None:
        # Only what the runtime said: an adapter's estimate is not a measurement.
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
                or self._measured.get(key) == size
            ):
                continue
            self._measured[key] = size
            if self.store is not None:
                self.store.record_envelope(
                    MeasuredEnvelope(key.consumer, key.model, key.options, size)
                )

    async def _reconcile_loop(self, link: Link) -> None:
        name = link.consumer.name
        backoff = Backoff(self.listing_interval, max(self.listing_interval, LISTING_BACKOFF_MAX))
        while True:
            try:
                await self.reconcile(link)
            except Exception as exc:
                # The books keep the last good listing; a failing runtime is asked less
                # often, and a wish for a listing does not cut the wait short.
                what = f"cannot list what {name} has loaded"
                self.loop_failed(f"listing-{name}", upstream_failure(link.consumer, exc, what))
                await asyncio.sleep(backoff.failed())
                link.reconcile_wanted.clear()
                continue
            backoff.succeeded()
            # asyncio.timeout, not wait_for: on 3.11 wait_for swallows a cancellation that
            # arrives as the event is set, and the gate could not stop this loop.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.listing_interval):
                    await link.reconcile_wanted.wait()
            link.reconcile_wanted.clear()
