"""The gate: the single owner of live state.

Everything that changes the books goes through here, on the event loop, without an
`await` between reading the state a decision depends on and the decision (the core
call is synchronous). Effects the core asks for (unloads with reclaim checks, waking
waiting requests, timers) run as tasks that report back as new events.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable

import aiohttp
import attrs

from gpugate.config.model import Config, Consumer
from gpugate.core.effects import Effect, Event, EventKind, Grant, Reject, Unload
from gpugate.core.explicit import LeaseTerms
from gpugate.core.failures import Failure, FailureClass
from gpugate.core.observation import HostObservation
from gpugate.core.planner import PlannerSettings
from gpugate.core.pressure import ReserveSettings
from gpugate.core.residents import ResidentKey, ResidentState
from gpugate.core.state import CoreSettings, GateCore, ListedModel
from gpugate.core.tickets import Demand, Lease
from gpugate.gate.events import ROUTINE, EventHub
from gpugate.gate.unloads import UnloadRunner
from gpugate.gate.upstream import Backoff, upstream_failure
from gpugate.gpu.sampler import Sampler
from gpugate.logs import OncePerInterval
from gpugate.runtimes.base import RuntimeAdapter
from gpugate.runtimes.registry import adapter_for
from gpugate.store.db import MeasuredEnvelope, Store

log = logging.getLogger("gpugate.gate")

RECONCILE_INTERVAL = 2.0
UPSTREAM_SKIP_AUTO_HEADERS = ("User-Agent", "Accept", "Accept-Encoding", "Content-Type")
"""Headers aiohttp would add on its own to forwarded requests: the client's (or none) go
up instead. Set on the session, which resolves them once rather than per request."""
ESTIMATE_TTL = 60.0
LISTING_BACKOFF_MAX = 10.0
"""The longest a failing listing loop waits before it asks again."""
TIMER_FLOOR = 0.05
"""A timer set again after it fired waits at least this long (no spinning on a past deadline)."""
LOG_INTERVAL = 60.0


class GateFailure(Exception):
    """A request cannot be admitted; carries the failure to tell its client."""

    def __init__(self, failure: Failure) -> None:
        super().__init__(failure.message)
        self.failure = failure


@attrs.define
class Link:
    """A managed consumer with its adapter and its upstream connection pool."""

    consumer: Consumer
    adapter: RuntimeAdapter
    session: aiohttp.ClientSession | None = None
    reconcile_wanted: asyncio.Event = attrs.field(factory=asyncio.Event)


AdapterFactory = Callable[[Consumer], RuntimeAdapter | None]


def core_settings(config: Config, adapters: AdapterFactory = adapter_for) -> CoreSettings:
    """Resolve the configuration into what the decision core needs."""
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
        consumer_gpus={c.name: c.gpu for c in config.consumers},
        queue_limit={c.name: c.queue_limit for c in config.consumers},
        stale_after=budget.stale_after,
        planner=PlannerSettings(),
        reconcilable=frozenset(
            c.name for c in config.consumers if (a := adapters(c)) is not None and a.reconcilable
        ),
    )


class Gate:
    """Owns the core and runs its effects. Used by the proxy and the control API."""

    def __init__(
        self,
        config: Config,
        sampler: Sampler,
        *,
        store: Store | None = None,
        clock: Callable[[], float] = time.monotonic,
        listing_interval: float = RECONCILE_INTERVAL,
        adapters: AdapterFactory = adapter_for,
    ) -> None:
        self.config = config
        self.listing_interval = listing_interval
        self.sampler = sampler
        self.store = store
        self.clock = clock
        self._adapters = adapters
        self.core = GateCore(core_settings(config, adapters))
        self.events = EventHub()
        self.links: dict[str, Link] = {}
        for consumer in config.consumers:
            adapter = adapters(consumer)
            if adapter is not None:
                self.links[consumer.name] = Link(consumer, adapter)
        self._waiters: dict[int, asyncio.Future[Lease]] = {}
        self._measured: dict[ResidentKey, int] = {}
        self._estimates: dict[tuple[str, str, str], tuple[float, int | None]] = {}
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = 0.0
        self._tasks: set[asyncio.Task[None]] = set()
        self._unloads = UnloadRunner(self)
        self._limiter = OncePerInterval(log, LOG_INTERVAL, clock=clock)
        self._listed_at: dict[str, float] = {}
        self._timer_backoff = Backoff(TIMER_FLOOR, 5.0)
        self.started = False

    # -- lifecycle -------------------------------------------------------------------------

    async def start(self) -> None:
        """Open the store, take a first sample, and start sampling and reconciling."""
        if self.store is not None:
            await self.store.open()
            for envelope in await self.store.envelopes():
                key = ResidentKey(envelope.consumer, envelope.model, envelope.options)
                self._measured[key] = envelope.bytes
        for link in self.links.values():
            self._listed_at[link.consumer.name] = self.clock()
            link.session = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(
                    total=None, sock_connect=link.consumer.timeouts.connect
                ),
                auto_decompress=False,
                skip_auto_headers=UPSTREAM_SKIP_AUTO_HEADERS,
                connector=aiohttp.TCPConnector(limit=0, force_close=False),
            )
        self.observe(await self.sampler.sample())
        budget = self.config.budget
        sampling = self.sampler.run(
            budget.sample_interval,
            self.observe,
            on_error=self._sampling_failed,
            max_backoff=max(budget.sample_interval, budget.stale_after / 2),
        )
        self._spawn(sampling, "sampler")
        for link in self.links.values():
            if link.adapter.reconcilable:
                self._spawn(self._reconcile_loop(link), f"reconcile-{link.consumer.name}")
        self.started = True

    async def close(self) -> None:
        """Stop background work and close connections (leases end with their requests)."""
        self.started = False
        if self._timer is not None:
            self._timer.cancel()
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        for future in self._waiters.values():
            if not future.done():
                future.cancel()
        for link in self.links.values():
            if link.session is not None:
                await link.session.close()
        if self.store is not None:
            await self.store.close()
        self.sampler.close()

    # -- the proxy's side ------------------------------------------------------------------

    async def acquire(self, demand: Demand) -> Lease:
        """Wait for a lease for this demand; raises GateFailure when it cannot have one."""
        admission = self.core.submit(demand, self.clock())
        future: asyncio.Future[Lease] | None = None
        if admission.waiting:
            future = asyncio.get_running_loop().create_future()
            self._waiters[admission.ticket_id] = future
        if admission.lease is not None:
            # A lease on a resident model sets no timer and wakes nobody.
            self._apply(admission.effects, timers=admission.lease.pending > 0)
            return admission.lease
        self._apply(admission.effects)
        if admission.failure is not None:
            raise GateFailure(admission.failure)
        assert future is not None
        try:
            return await future
        except asyncio.CancelledError:
            self._waiters.pop(admission.ticket_id, None)
            if future.done() and not future.cancelled() and future.exception() is None:
                self.release(future.result(), failed=True)
            else:
                self._apply(self.core.cancel(admission.ticket_id, self.clock()))
            raise

    def loaded(self, lease: Lease) -> None:
        """The runtime started answering the lease's request: its model is loaded."""
        if lease.pending:
            self._apply(self.core.loaded(lease.id, self.clock()))

    def release(self, lease: Lease, *, failed: bool = False) -> None:
        """The lease's request is over."""
        now = self.clock()
        self._apply(self.core.release(lease.id, now, failed=failed))
        if self.store is not None:
            self.store.record_lease(lease, now - lease.granted, "failed" if failed else "done")

    def unloaded(
        self, key: ResidentKey, *, reclaimed: bool, failure: Failure | None = None
    ) -> None:
        """An unload finished: its bytes are back, did not come back in time, or the
        runtime could not be asked (`failure`)."""
        self._apply(self.core.unloaded(key, self.clock(), reclaimed=reclaimed, failure=failure))

    def report(self, failure: Failure) -> None:
        """A failure seen outside the core (an upstream that crashed or could not load)."""
        self._apply(
            [
                Event(
                    EventKind.FAILURE,
                    self.clock(),
                    consumer=failure.consumer,
                    model=failure.model,
                    gpu=failure.gpu,
                    failure=failure,
                    detail=failure.message,
                )
            ]
        )

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

    # -- what the world reports ------------------------------------------------------------

    def observe(self, sample: HostObservation) -> None:
        """A sample from NVML (called by the sampler and by unload checks)."""
        if sample.error is not None and self.core.fault is None:
            log.warning("NVML error: %s (%s)", sample.error.message, sample.error.name)
        self._apply(self.core.observe(sample, self.clock()))
        # Memory the books cannot explain is usually a model loaded behind the gate's back:
        # ask the runtime what it has rather than wait for the next periodic listing.
        for rows in self.core.telemetry.unexplained.values():
            for consumer, nbytes in rows.items():
                link = self.links.get(consumer)
                if nbytes and link is not None and link.adapter.reconcilable:
                    self.want_reconcile(consumer)

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
                    bytes=model.size_vram,
                    size=max(model.size, model.size_vram),
                    priority=adapter.model_priority(model.name),
                    policy=residency.policy,
                    idle_ttl=residency.idle_ttl,
                    reload_seconds=adapter.reload_seconds(model.name, model.size),
                )
            )
        self._apply(
            self.core.reconcile(
                link.consumer.name, link.consumer.gpu, listed, asked_at=asked_at, now=self.clock()
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

    def _learn_envelopes(self, link: Link, listed: list[ListedModel]) -> None:
        sizes = {m.model: m.size for m in listed}
        for resident in self.core.residents(link.consumer.gpu):
            key = resident.key
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

    # -- effects ---------------------------------------------------------------------------

    def _apply(self, effects: tuple[Effect, ...] | list[Effect], *, timers: bool = True) -> None:
        if not effects:
            return
        for effect in effects:
            if isinstance(effect, Event):
                self.events.publish(effect)
                if self.store is not None and effect.kind not in ROUTINE:
                    self.store.record_event(effect)
            elif isinstance(effect, Grant):
                self._wake(effect)
            elif isinstance(effect, Reject):
                future = self._waiters.pop(effect.ticket_id, None)
                if future is not None and not future.done():
                    future.set_exception(GateFailure(effect.failure))
            elif isinstance(effect, Unload):
                self._spawn(self._unloads.run(effect), f"unload-{effect.key}")
        if timers:
            self._arm_timer()

    def _wake(self, grant: Grant) -> None:
        future = self._waiters.pop(grant.ticket_id, None)
        if future is None or future.done():
            # Its client is gone: the lease ends before it began.
            self._apply(self.core.release(grant.lease.id, self.clock(), failed=True))
            return
        future.set_result(grant.lease)

    def _arm_timer(self, *, floor: float = 0.0) -> None:
        """Keep one timer for the core's next deadline.

        A timer already set for an earlier moment stays: when it fires, `tick` finds
        nothing due yet and the timer is set again for what is due next. That keeps the
        per-request path from cancelling and re-creating timers.
        """
        wake = self.core.next_wakeup()
        if wake is None:
            return
        if self._timer is not None:
            if self._timer_at <= wake + 1e-6:
                return
            self._timer.cancel()
        self._timer_at = wake
        self._timer = asyncio.get_running_loop().call_later(
            max(floor, wake - self.clock()), self._on_timer
        )

    def _on_timer(self) -> None:
        self._timer = None
        try:
            self._apply(self.core.tick(self.clock()), timers=False)
        except Exception as exc:
            message = f"INVALID_OUTPUT: the timer could not run: {exc!r}"
            self.loop_failed("timer", Failure(FailureClass.INVALID_OUTPUT, message))
            delay = self._timer_backoff.failed()
            self._timer_at = self.clock() + delay
            self._timer = asyncio.get_running_loop().call_later(delay, self._on_timer)
            return
        self._timer_backoff.succeeded()
        # Always set again: a tick with nothing due yet (the deadline it was set for moved
        # later meanwhile) still leaves a next deadline.
        self._arm_timer(floor=TIMER_FLOOR)

    # -- loops that fail -------------------------------------------------------------------

    def loop_failed(self, loop: str, failure: Failure) -> None:
        """A background loop failed: one log line per interval with a count, and an event."""
        key = f"{loop}:{failure.failure_class.value}"
        if self._limiter.warning(key, "%s", failure.message):
            self.report(failure)

    def _sampling_failed(self, exc: BaseException) -> None:
        message = f"DRIVER_ERROR: the GPUs could not be sampled: {exc!r}"
        self.loop_failed("sampler", Failure(FailureClass.DRIVER_ERROR, message))

    def _spawn(self, coro, name: str) -> None:  # type: ignore[no-untyped-def]
        task = asyncio.create_task(coro, name=f"gpugate-{name}")
        self._tasks.add(task)
        task.add_done_callback(self._task_done)

    def _task_done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("background task %s failed", task.get_name(), exc_info=task.exception())

    # -- views for the control API ---------------------------------------------------------

    def recent_events(self) -> list[Event]:
        return list(self.events.recent)

    # -- reload ----------------------------------------------------------------------------

    def reconfigure(self, config: Config) -> None:
        """Apply a reloaded configuration: per-model settings, classes and reserves.

        The caller keeps in `config` what only a restart can change (listeners, upstreams,
        GPUs, sampling); consumers are matched by name and none is added or removed here.
        """
        settings = core_settings(config, self._adapters)
        core = self.core
        core.settings = settings
        # The core's parts took their settings when they were built: these are the ones a
        # reload may change.
        telemetry = core.telemetry
        telemetry._reserve = settings.reserve
        telemetry._reserve_by_gpu = dict(settings.reserve_by_gpu)
        for gpu, history in telemetry._history.items():
            history.settings = telemetry.reserve_settings(gpu)
        core.scheduler._max_wait = lambda demand: settings.wait_for(demand.priority)
        core.scheduler._queue_limit = lambda name: settings.queue_limit.get(
            name, settings.default_queue_limit
        )
        for consumer in config.consumers:
            link = self.links.get(consumer.name)
            if link is not None and link.consumer != consumer:
                adapter = self._adapters(consumer)
                if adapter is not None:
                    link.consumer = consumer
                    link.adapter = adapter
        self.config = config

    # -- explicit leases (work that is not a request) --------------------------------------

    async def hold(self, terms: LeaseTerms) -> Lease:
        """Wait for an explicit lease; raises GateFailure when it cannot have one.

        A caller that goes away while waiting leaves no ticket behind, and a grant that
        finds it gone is released at once (as for a request).
        """
        admission = self.core.ask(terms, self.clock())
        if admission.lease is not None:
            self._apply(admission.effects)
            return admission.lease
        future: asyncio.Future[Lease] | None = None
        if admission.waiting:
            future = asyncio.get_running_loop().create_future()
            self._waiters[admission.ticket_id] = future
        self._apply(admission.effects)
        if admission.failure is not None:
            raise GateFailure(admission.failure)
        assert future is not None
        try:
            return await future
        except asyncio.CancelledError:
            self._waiters.pop(admission.ticket_id, None)
            if future.done() and not future.cancelled() and future.exception() is None:
                self.release(future.result(), failed=True)
            else:
                self._apply(self.core.cancel(admission.ticket_id, self.clock()))
            raise

    def renew(self, lease_id: int) -> Lease | None:
        """Extend an explicit lease by its ttl; None when it is not held (any more)."""
        self._apply(self.core.renew(lease_id, self.clock()))
        lease = self.core.lease(lease_id)
        return lease if lease is not None and lease.expires_at is not None else None

    def explicit_leases(self) -> list[Lease]:
        """The explicit leases held now, by id."""
        return sorted(
            (x for x in self.core.leases() if x.expires_at is not None), key=lambda x: x.id
        )
