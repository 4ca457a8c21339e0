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

from gpugate.config.model import Config
from gpugate.core.effects import (
    Effect,
    Event,
    EventKind,
    Grant,
    Preempt,
    Reject,
    Start,
    Unload,
    Wake,
)
from gpugate.core.failures import Failure, FailureClass
from gpugate.core.observation import HostObservation
from gpugate.core.residents import ResidentKey
from gpugate.core.state import GateCore
from gpugate.core.tickets import Demand, Lease
from gpugate.gate.admission import AdmissionWork
from gpugate.gate.events import ROUTINE, EventHub
from gpugate.gate.exchange_work import ExchangeWork
from gpugate.gate.jobs import JobWatch, JobWork
from gpugate.gate.links import (
    RECONCILE_INTERVAL,
    UPSTREAM_SKIP_AUTO_HEADERS,
    AdapterFactory,
    GateFailure,
    Link,
    LinkWork,
    SignalSeen,
    core_settings,
    make_links,
)
from gpugate.gate.start_leases import StartLeases
from gpugate.gate.starts import ProcessStarts
from gpugate.gate.unloads import UnloadRunner
from gpugate.gate.upstream import Backoff
from gpugate.gpu.sampler import Sampler
from gpugate.logs import OncePerInterval
from gpugate.runtimes.base import HealthSignal
from gpugate.runtimes.registry import adapter_for
from gpugate.store.db import Store

__all__ = [
    "UPSTREAM_SKIP_AUTO_HEADERS",
    "Gate",
    "GateFailure",
    "Link",
    "core_settings",
]

log = logging.getLogger("gpugate.gate")

TIMER_FLOOR = 0.05
"""A timer set again after it fired waits at least this long (no spinning on a past deadline)."""
LOG_INTERVAL = 60.0


class Gate(LinkWork, AdmissionWork, JobWork, ExchangeWork):
    """Owns the core and runs its effects. Used by the proxy and the control API.

    Its parts: `LinkWork` (links, listings, envelopes), `AdmissionWork` (leases) and
    `JobWork` (when tracked jobs end, their peaks).
    """

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
        self.links: dict[str, Link] = make_links(config, adapters)
        self._waiters: dict[int, asyncio.Future[Lease]] = {}
        self._measured: dict[ResidentKey, int] = {}
        self._measured_scale: dict[ResidentKey, float] = {}
        self._job_watches: dict[int, JobWatch] = {}
        self._estimates: dict[tuple[str, str, str], tuple[float, int | None]] = {}
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = 0.0
        self._tasks: set[asyncio.Task[None]] = set()
        self._unloads = UnloadRunner(self)
        self._limiter = OncePerInterval(log, LOG_INTERVAL, clock=clock)
        self._listed_at: dict[str, float] = {}
        self._signal_seen: dict[str, SignalSeen] = {}
        self._timer_backoff = Backoff(TIMER_FLOOR, 5.0)
        self.starts = StartLeases(self)
        self.processes = ProcessStarts(self)
        self.started = False

    # -- lifecycle -------------------------------------------------------------------------

    async def start(self) -> None:
        """Open the store, take a first sample, and start sampling and reconciling."""
        if self.store is not None:
            await self.store.open()
            for envelope in await self.store.envelopes():
                key = ResidentKey(envelope.consumer, envelope.model, envelope.options)
                self._measured[key] = envelope.bytes
                if envelope.scale is not None:
                    self._measured_scale[key] = envelope.scale
        for link in self.links.values():
            # Every signal gets its first bound from the start, not from a first answer.
            self._listed_at[link.consumer.name] = self.clock()
            self._signal_seen[link.consumer.name] = SignalSeen(self.clock())
            link.open()
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
            if link.adapter.health_signal in (HealthSignal.HEALTH_ROUTE, HealthSignal.PROCESS):
                self._spawn(self._health_loop(link), f"health-{link.consumer.name}")
        self.start_job_loops(self._spawn)
        self.processes.on_gate_start()
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
        await self.processes.close()
        await self.starts.close()
        for future in self._waiters.values():
            if not future.done():
                future.cancel()
        for link in self.links.values():
            if link.session is not None:
                await link.session.close()
        if self.store is not None:
            await self.store.close()
        self.sampler.close()

    def unloaded(
        self, key: ResidentKey, *, reclaimed: bool, failure: Failure | None = None
    ) -> None:
        """An unload finished: its bytes are back, did not come back in time, or the
        runtime could not be asked (`failure`)."""
        self._apply(self.core.unloaded(key, self.clock(), reclaimed=reclaimed, failure=failure))

    def withdraw(self, link: Link, job: str | None, demand: Demand) -> None:
        """A job the runtime accepted before its lease is to be dropped, its lease not to be
        had (or its client gone): ask the runtime (`UnloadRunner.withdraw`), then settle
        what it left (`withdrawn`)."""
        self._spawn(self._unloads.withdraw(link, job, demand), f"withdraw-{link.consumer.name}")

    def withdrawn(self, demand: Demand) -> None:
        """The runtime was asked to drop a job accepted before its lease: what it left is
        given back (`GateCore.withdrawn`)."""
        self._apply(self.core.withdrawn(demand, self.clock()))

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

    # -- what the world reports ------------------------------------------------------------

    def observe(self, sample: HostObservation) -> None:
        """A sample from NVML (called by the sampler and by unload checks)."""
        if sample.error is not None and self.core.fault is None:
            log.warning("NVML error: %s (%s)", sample.error.message, sample.error.name)
        self._apply(self.core.observe(sample, self.clock()))
        self.observe_jobs(sample)
        self.processes.envelopes.observe()
        # Memory the books cannot explain is usually a model loaded behind the gate's back:
        # ask the runtime what it has rather than wait for the next periodic listing.
        for rows in self.core.telemetry.unexplained.values():
            for consumer, nbytes in rows.items():
                link = self.links.get(consumer)
                if nbytes and link is not None and link.adapter.reconcilable:
                    self.want_reconcile(consumer)

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
            elif isinstance(effect, Preempt):
                self._spawn(self._unloads.preempt(effect), f"preempt-{effect.consumer}")
            elif isinstance(effect, (Start, Wake)):
                self.processes.carry_out(effect)
        if timers:
            self._arm_timer()

    def _deadline(self, at: float | None) -> None:
        """A deadline at `at` may be new: keep the timer at or before it, without asking the
        core for all of them while it is."""
        if at is not None and (self._timer is None or self._timer_at > at + 1e-6):
            self._arm_timer()

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

    def probe_failed(self, consumer: str, message: str) -> None:
        """A health probe failed: logged once per interval with a count. Not a failure
        event: no request failed, and health's age already says it."""
        self._limiter.warning(f"health-{consumer}", "%s", message)

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
        return self.events.recent()

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

    # -- operator actions ------------------------------------------------------------------

    def evict(self, key: ResidentKey, *, force: bool = False, who: str = "token") -> None:
        """Unload an idle resident now (raises `EvictionRefused`); the unload runner does it."""
        self._apply(self.core.evict(key, self.clock(), force, who))

    def drain(self, consumer: str, *, who: str = "token") -> None:
        """The consumer admits nothing new; what is in flight finishes."""
        self._apply(self.core.drain(consumer, self.clock(), who))

    def undrain(self, consumer: str, *, who: str = "token") -> None:
        self._apply(self.core.undrain(consumer, self.clock(), who))

    def pause(self, gpu: int, *, who: str = "token") -> None:
        """New demands on the GPU wait in its queue until resume."""
        self._apply(self.core.pause(gpu, self.clock(), who))

    def resume(self, gpu: int, *, who: str = "token") -> None:
        self._apply(self.core.resume(gpu, self.clock(), who))
