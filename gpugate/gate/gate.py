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
from collections.abc import Callable, Sequence

from gpugate.config.model import Config
from gpugate.core.effects import (
    Effect,
    Event,
    EventKind,
    Grant,
    Overrun,
    Preempt,
    Reject,
    Start,
    Unload,
    Wake,
)
from gpugate.core.failures import Failure, FailureClass
from gpugate.core.lifecycle import LifeReport
from gpugate.core.observation import HostObservation
from gpugate.core.residents import ResidentKey
from gpugate.core.state import GateCore
from gpugate.core.tickets import Demand, Lease
from gpugate.gate.admission import Leases
from gpugate.gate.envelopes import EnvelopeBook
from gpugate.gate.events import ROUTINE, EventHub
from gpugate.gate.failure import GateFailure
from gpugate.gate.jobs import JobWatch
from gpugate.gate.link import (
    UPSTREAM_SKIP_AUTO_HEADERS,
    Link,
    RuntimeLookup,
    listed,
    make_links,
)
from gpugate.gate.requests import Requests
from gpugate.gate.rewarm import Rewarms
from gpugate.gate.settings import core_settings, resettle
from gpugate.gate.signals import RECONCILE_INTERVAL, ConsumerSignals
from gpugate.gate.start_leases import StartLeases
from gpugate.gate.starts import ProcessStarts
from gpugate.gate.unloads import UnloadRunner
from gpugate.gate.upstream import Backoff
from gpugate.gpu.sampler import Sampler
from gpugate.logs import OncePerInterval
from gpugate.runtimes.registry import runtime_for
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
UNLOAD_HURRY = 3.0
"""Seconds of fast sampling after a runtime was asked to unload through the gate: an idle
runtime gives its memory back within a second or two of being asked."""


class Gate:
    """Owns the core and the live state, runs the core's effects, and is the face the proxy
    and the control API use.

    Its parts, each built with only what it uses: `links` (a link per fronted consumer:
    link.py), `envelopes` (what a model takes: envelopes.py), `signals` (listings and
    health: signals.py), `leases` (admission.py), `jobs` (jobs.py), `requests` (a
    listener's requests: requests.py), `processes` and `starts` (process runtimes:
    starts.py, process_*.py, start_leases.py), and the unload runner (unloads.py). They
    hand the core's effects back here (`apply`), and the effect runners report what became
    of them.
    """

    def __init__(
        self,
        config: Config,
        sampler: Sampler,
        *,
        store: Store | None = None,
        clock: Callable[[], float] = time.monotonic,
        listing_interval: float = RECONCILE_INTERVAL,
        runtimes: RuntimeLookup = runtime_for,
    ) -> None:
        self.config = config
        self.sampler = sampler
        self.store = store
        self.clock = clock
        self._runtimes = runtimes
        self.links: dict[str, Link] = make_links(config, runtimes)
        self.core = GateCore(core_settings(config, listed(self.links)))
        self.events = EventHub()
        self.envelopes = EnvelopeBook(store, clock)
        self.signals = ConsumerSignals(
            self.core, self.links, self.envelopes, clock, listing_interval, self
        )
        self.leases = Leases(self.core, clock, self.events, store, self)
        self.jobs = JobWatch(self.core, self.links, self.envelopes, clock, store, self)
        self.starts = StartLeases(self.core, self.leases, config.budget.sample_interval)
        self.processes = ProcessStarts(
            self.core, self.links, clock, self.leases, self.envelopes, self.starts, self
        )
        self.requests = Requests(self, self.envelopes, self.core, clock)
        self._unloads = UnloadRunner(
            self.core, self.links, sampler, clock, self._reclaim_timeout, self
        )
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = 0.0
        self.rewarms = Rewarms(self.core, self.links, self.leases, clock, self, self._spawn)
        """Kept-warm models evicted for a higher class, loaded again (`gate/rewarm.py`)."""
        self._timer_backoff = Backoff(TIMER_FLOOR, 5.0)
        self._tasks: set[asyncio.Task[None]] = set()
        self._limiter = OncePerInterval(log, LOG_INTERVAL, clock=clock)
        self.started = False

    # -- lifecycle -------------------------------------------------------------------------

    async def start(self) -> None:
        """Open the store, take a first sample, and start sampling and reconciling."""
        if self.store is not None:
            await self.store.open()
            self.envelopes.load(await self.store.envelopes())
        self.signals.open()
        self.observe(await self.sampler.sample())
        budget = self.config.budget
        sampling = self.sampler.run(
            budget.sample_interval,
            self.observe,
            on_error=self._sampling_failed,
            max_backoff=max(budget.sample_interval, budget.stale_after / 2),
        )
        self._spawn(sampling, "sampler")
        self.signals.start(self._spawn)
        self.jobs.start(self._spawn)
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
        self.leases.close()
        for link in self.links.values():
            if link.session is not None:
                await link.session.close()
        if self.store is not None:
            await self.store.close()
        self.sampler.close()

    # -- what the parts and the effect runners report --------------------------------------

    def unloaded(
        self, key: ResidentKey, *, reclaimed: bool, failure: Failure | None = None
    ) -> None:
        """An unload finished: its bytes are back, did not come back in time, or the
        runtime could not be asked (`failure`)."""
        self.apply(self.core.unloaded(key, self.clock(), reclaimed=reclaimed, failure=failure))

    def withdraw(self, link: Link, job: str | None, demand: Demand) -> None:
        """A job the runtime accepted before its lease is to be dropped, its lease not to be
        had (or its client gone): ask the runtime (`UnloadRunner.withdraw`), then settle
        what it left (`withdrawn`)."""
        self._spawn(self._unloads.withdraw(link, job, demand), f"withdraw-{link.consumer.name}")

    def withdrawn(self, demand: Demand) -> None:
        """The runtime was asked to drop a job accepted before its lease: what it left is
        given back (`GateCore.withdrawn`)."""
        self.apply(self.core.job_events.withdrawn(demand, self.clock()))

    def preempted(self, effect: Preempt, failure: Failure | None) -> None:
        """The runtime was asked to stop the jobs (`failure`: it could not be)."""
        self.jobs.preempted(effect, failure)

    def process_ready(self, lease: Lease) -> None:
        """The process started under `lease` answers: it is resident now."""
        self.apply(self.core.process_ready(lease.id, self.clock()))

    def start_process(self, lease: Lease) -> None:
        """The runtime's PROCESS lease is held: the core starts or wakes it (an effect)."""
        self.apply(self.core.lifecycles.start(lease.key.consumer, lease.id, self.clock()))

    def life_report(self, consumer: str, report: LifeReport, detail: str = "") -> None:
        """What the lifecycle interface saw of the runtime (started, failed, stopped, ...)."""
        self.apply(self.core.lifecycles.reported(consumer, report, self.clock(), detail))

    def want_reconcile(self, consumer: str) -> None:
        """Something changed behind the books: list residents soon."""
        self.signals.want_reconcile(consumer)

    def unload_asked(self, consumer: str) -> None:
        """A client asked a runtime to unload, through the gate: list its residents and ask
        after its jobs now, and sample fast for a while, so the memory it gives back is seen
        (and handed to whoever waits for it, or warmed again) within HURRY_EVERY rather
        than a whole interval."""
        self.want_reconcile(consumer)
        link = self.links.get(consumer)
        if link is not None:
            link.jobs_check.set()
        self.sampler.hurry(UNLOAD_HURRY)

    def report(self, failure: Failure) -> None:
        """A failure seen outside the core (an upstream that crashed or could not load)."""
        self.apply(
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
        self.apply(self.core.observe(sample, self.clock()))
        self.rewarms.check()
        self.jobs.observe(sample)
        self.processes.envelopes.observe()
        # Memory the books cannot explain is usually a model loaded behind the gate's back:
        # ask the runtime what it has rather than wait for the next periodic listing.
        for rows in self.core.telemetry.unexplained.values():
            for consumer, nbytes in rows.items():
                link = self.links.get(consumer)
                if nbytes and link is not None and link.runtime.inventory is not None:
                    self.want_reconcile(consumer)

    # -- effects ---------------------------------------------------------------------------

    def apply(self, effects: Sequence[Effect], *, timers: bool = True) -> None:
        """Carry out what the core decided: publish its events, wake or fail the callers
        waiting for a ticket, run unloads, preemptions and starts as tasks, and keep the
        one timer at the core's next deadline."""
        if not effects:
            return
        # Before anything runs: the tickets the unloads are for still wait.
        self.core.rewarms.note(self.core, effects, self.clock())
        for effect in effects:
            if isinstance(effect, Event):
                self.events.publish(effect)
                if self.store is not None and effect.kind not in ROUTINE:
                    self.store.record_event(effect)
            elif isinstance(effect, Grant):
                self.leases.granted(effect)
            elif isinstance(effect, Reject):
                self.leases.rejected(effect)
            elif isinstance(effect, Unload):
                self._spawn(self._unloads.run(effect), f"unload-{effect.key}")
            elif isinstance(effect, Preempt):
                self._spawn(self._unloads.preempt(effect), f"preempt-{effect.consumer}")
            elif isinstance(effect, (Start, Wake)):
                self.processes.launches.carry_out(effect)
            elif isinstance(effect, Overrun):
                self._overran(effect)
        if timers:
            self._arm_timer()

    def _overran(self, overrun: Overrun) -> None:
        """A consumer holds more than its lease: what the one resident it is pinned on
        holds is its measured size from now on. (A runtime that can be asked to give
        memory back would be asked here.)"""
        if overrun.key is not None and overrun.measured is not None:
            self.envelopes.learn_overrun(overrun.key, overrun.measured)

    def deadline(self, at: float | None) -> None:
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
            self.apply(self.core.tick(self.clock()), timers=False)
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

    def _reclaim_timeout(self) -> float:
        return self.config.budget.reclaim_timeout

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
        for consumer in config.consumers:
            link = self.links.get(consumer.name)
            if link is not None and link.consumer != consumer:
                runtime = self._runtimes(consumer)
                if runtime is not None:
                    link.consumer = consumer
                    link.runtime = runtime
        resettle(self.core, core_settings(config, listed(self.links)))
        self.config = config

    # -- operator actions ------------------------------------------------------------------

    def evict(self, key: ResidentKey, *, force: bool = False, who: str = "token") -> None:
        """Unload an idle resident now (raises `EvictionRefused`); the unload runner does it."""
        self.apply(self.core.operator.evict(key, self.clock(), force, who))

    def drain(self, consumer: str, *, who: str = "token") -> None:
        """The consumer admits nothing new; what is in flight finishes."""
        self.apply(self.core.operator.drain(consumer, self.clock(), who))

    def undrain(self, consumer: str, *, who: str = "token") -> None:
        self.apply(self.core.operator.undrain(consumer, self.clock(), who))

    def pause(self, gpu: int, *, who: str = "token") -> None:
        """New demands on the GPU wait in its queue until resume."""
        self.apply(self.core.operator.pause(gpu, self.clock(), who))

    def resume(self, gpu: int, *, who: str = "token") -> None:
        self.apply(self.core.operator.resume(gpu, self.clock(), who))
