"""Process starts: the gate's own, when a request's work needs the process, and at its start.

A runtime whose memory is its process's (its `Lifecycle`) is handled here:

* **Start on demand** (`ProcessStarts.serve_lease`): a request the runtime's work needs
  (`needs_process`) is forwarded under a 0-byte lease on the process's resident, which
  keeps it busy (never evicted while the request runs). When there is no resident the
  process is stopped, or running outside the books: one found running (its command line,
  its port) is adopted, never started twice; otherwise the gate takes a PROCESS-scope
  lease for its envelope (measured once it ran, else configured; it may wait, evict or
  fail like any demand), starts it through its lifecycle's control, and waits for its port
  and health (`wait_ready`): the core's Start (or Wake) carried out by `ProcessLaunches`
  (process_launch.py). The answer makes it resident (`process_ready`), whatever NVML shows
  yet; its bytes follow NVML from there.
* **Failed starts back off** (`StartBackoff`): one failure event per failed start, the
  runtime's output in the gate's log only, and no new start until the backoff ran out: a
  request waits for it when it ends within the request's own wait, and is refused (503
  START_BACKOFF with Retry-After) when it ends later.
* **Eviction is a stop** (the core's Stop effect), confirmed when NVML shows the
  consumer's memory gone; the next request starts it again.
* **A crash** (a supervised child's exit, an adopted process's end) is one RUNTIME_CRASH
  event; its resident goes, and an `always_warm` process is started again after its
  backoff, under a lease. An end while a request switched its model is that request's
  failed load, not a crash (process_ends.py).
* **At gate start** an `always_warm` process is started under a lease; one already
  running is adopted; one with no control is reserved for its envelope until it shows.
  `warm` waits for them (the `gpugate: ready` line) and says which is not up.
* **While it is not up** (process_absent.py): a request waits for a start under way;
  while the process is stopped, its health route is answered by the gate and any other
  request starts it. Neither is a crash.
* **One start, one lease**: while the gate holds the start lease of a process it is
  starting, `gpugate admit` from that process's unit (its ExecStartPre) joins that lease
  (`StartLeases.own`, start_leases.py), and the gate waits for a start lease `gpugate
  admit` holds rather than taking a second one.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

import attrs

from gpugate.core.classes import PriorityClass, ResidencyPolicy
from gpugate.core.failures import FailureClass
from gpugate.core.lifecycle import Eviction, LifeReport, LifeState
from gpugate.core.state import GateCore
from gpugate.core.tickets import Lease
from gpugate.core.units import format_gib
from gpugate.gate.admission import Leases
from gpugate.gate.envelopes import EnvelopeBook
from gpugate.gate.failure import GateFailure
from gpugate.gate.link import Link
from gpugate.gate.process_absent import StartsUnderWay, health_route, not_up, stand_in
from gpugate.gate.process_absent import start_timeout as start_timeout_of
from gpugate.gate.process_books import LifeReports, ProcessBooks, control_of, process_model
from gpugate.gate.process_ends import ProcessEnds
from gpugate.gate.process_envelopes import ProcessEnvelopes
from gpugate.gate.process_found import ProcessFinder
from gpugate.gate.process_launch import ProcessLaunches
from gpugate.gate.start_leases import StartLeases
from gpugate.runtimes.base import ApiFamily
from gpugate.runtimes.process_supervised import SupervisedCommand
from gpugate.runtimes.replies import ErrorReply

log = logging.getLogger("gpugate.starts")

POLL_INTERVAL = 0.05
"""How often a start waits for an unload or another start to end."""
ADOPT_FLOOR = 1024**2
"""The least a lease adopting a running process asks for (it must have bytes to appear)."""
ATTEMPTS = 3
"""Starts one request may ask for when the process keeps going away under it."""


class ProcessStarts:
    """Processes the gate starts when a request needs them, and at its own start."""

    def __init__(
        self,
        core: GateCore,
        links: dict[str, Link],
        clock: Callable[[], float],
        leases: Leases,
        book: EnvelopeBook,
        starts: StartLeases,
        reports: LifeReports,
    ) -> None:
        """`core` is read (lifecycles, residents, what NVML shows) and given each
        controlled runtime's lifecycle here; leases are taken and released through
        `leases`; what the lifecycle did goes to `reports`."""
        self.core = core
        self.links = links
        self.clock = clock
        self.leases = leases
        self.starts = starts
        self.reports = reports
        self._locks: dict[str, asyncio.Lock] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self.envelopes = ProcessEnvelopes(core, links, book)
        self.books = ProcessBooks(core, book, starts, clock)
        self.finder = ProcessFinder(leases, self.books, reports)
        self.under_way = StartsUnderWay()
        self._warming: dict[str, asyncio.Task[None]] = {}
        """The start of each always_warm process at the gate's start, for `warm`."""
        self.ends = ProcessEnds(core, self.books, self.envelopes, reports, self._restart)
        self.launches = ProcessLaunches(
            core, links, clock, reports, self.envelopes, self.books, self._spawn, self._warm_again
        )
        for link in links.values():
            process = control_of(link)
            if process is None:
                continue
            eviction = Eviction.SLEEP if process.sleeps else Eviction.STOP
            core.lifecycles.register(link.consumer.name, eviction, clock())
            if isinstance(process, SupervisedCommand):
                process.on_exit = lambda exit, link=link: self.ends.exited(link, exit)

    async def running(self, link: Link) -> bool:
        """Whether the consumer's process is there (its control says so), bounded."""
        return await self.finder.running(link)

    def starting(self, consumer: str) -> bool:
        """Whether the consumer's runtime is starting now (not yet answering)."""
        life = self.core.lifecycle(consumer)
        return life is not None and life.state is LifeState.STARTING

    def fronts(self, link: Link) -> bool:
        """Whether requests to `link` need its process running (a controlled process
        runtime with an envelope)."""
        return control_of(link) is not None and self.books.envelope(link) is not None

    def absent(self, link: Link) -> bool:
        """Whether the books say the consumer's process is not there: stopped (on purpose,
        or after a failure already reported), being stopped, or being started. Never for
        a runtime the gate puts to sleep: its process is not the gate's to start or stop,
        and it serves what it serves asleep too (vLLM's server)."""
        process = control_of(link)
        life = self.core.lifecycle(link.consumer.name)
        return (
            process is not None
            and not process.sleeps
            and life is not None
            and life.state in (LifeState.STOPPED, LifeState.STOPPING, LifeState.STARTING)
        )

    async def settle(self, link: Link) -> bool:
        """Wait while the gate starts the consumer's process, within its start timeout;
        False when the start is still under way after that. A runtime woken from sleep
        keeps serving meanwhile: nothing to wait for."""
        process = control_of(link)
        if process is None or process.sleeps:
            return True
        await self.ends.wait_for_end(link)
        return await self.under_way.wait(link.consumer.name, start_timeout_of(link))

    def stand_in(self, link: Link, method: str, path: str, api: ApiFamily) -> ErrorReply | None:
        """The gate's answer in place of a process it does not run now, for a request on
        its health route (process_absent.py); None for any other request (it starts it)."""
        life = self.core.lifecycle(link.consumer.name)
        if life is None or not health_route(link, method, path) or not self.absent(link):
            return None
        if life.state not in (LifeState.STOPPED, LifeState.STOPPING):
            return None
        return stand_in(link, method, self.books.backoff(link, until_up=True), api)

    # -- requests --------------------------------------------------------------------------

    async def serve_lease(self, link: Link, priority: PriorityClass) -> Lease:
        """A 0-byte lease on the consumer's running process, started first if it is not."""
        for _ in range(ATTEMPTS):
            await self.ensure_running(link, priority)
            resident = self.books.live(link)
            if resident is None:
                continue
            # No await between finding the resident and submitting the demand on it.
            lease = await self.leases.acquire(
                self.books.demand(link, priority, resident.key, resident.gpu)
            )
            if not lease.pending:
                return lease
            # The process went (evicted, crashed) while this request waited on it.
            self.leases.release(lease, failed=True)
        raise GateFailure(
            self.books.failure(link, FailureClass.RUNTIME_CRASH, "it kept stopping while starting")
        )

    async def ensure_running(self, link: Link, priority: PriorityClass) -> None:
        """Return once the books hold the consumer's process (loading or resident),
        starting it under a PROCESS lease when it is stopped, adopting it when it runs."""
        name = link.consumer.name
        await self.ends.wait_for_end(link)
        async with self._locks.setdefault(name, asyncio.Lock()):
            deadline = self.clock() + self.books.admission_timeout(link)
            while self.books.live(link) is None:
                if not self.books.going(link) and not self.books.admitted_elsewhere(link):
                    break
                if self.clock() >= deadline:
                    what = "its stop or another start did not end in time"
                    raise GateFailure(self.books.failure(link, FailureClass.TIMEOUT, what))
                await asyncio.sleep(POLL_INTERVAL)
            else:
                return
            with self.under_way.running(name):
                await self._bring_up(link, priority, deadline)

    async def _bring_up(self, link: Link, priority: PriorityClass, deadline: float) -> None:
        """Adopt the consumer's process if it runs, else start it under a PROCESS lease.

        A start its backoff holds off (its last start failed, or it ended on its own) is
        waited for when the backoff ends before `deadline` (the request's own wait), and
        refused (START_BACKOFF, with Retry-After) only when it ends later: a process that
        ended once is started again for the next request, a second later, not refused for
        that second."""
        name = link.consumer.name
        while True:
            await self.finder.read_unit(link)
            process = control_of(link)
            running = (
                process is None or await self.finder.found(link, process) is LifeReport.FOUND_UP
            )
            refused = None if running else self.books.backoff(link)
            if refused is None:
                break
            wait = refused.retry_after
            if wait is None or self.clock() + wait > deadline:
                raise GateFailure(refused)
            log.info("%s: its start waits %.1fs for its backoff", name, wait)
            # The backoff's end, a time the core set: nothing else would signal it.
            await asyncio.sleep(wait)
        demand = self.books.demand(link, priority)
        if running:
            # Adopted: what NVML already shows of it is counted (as unexplained); the
            # lease covers the rest, so nothing is counted twice. It is on the GPU
            # where NVML shows it.
            gpu = self.books.shown_on(link)
            shown = self.core.telemetry.unexplained.get(gpu, {}).get(name, 0)
            demand = attrs.evolve(
                demand, gpu=gpu, envelope=max(ADOPT_FLOOR, demand.envelope - shown)
            )
            lease = await self.leases.acquire(demand)
        else:
            # The gate chooses its GPU among the consumer's, and starts it there.
            (lease,) = await self.leases.acquire_on(demand, link.consumer.cards)
        if running:
            log.info("%s is running: adopted, its memory counted from the next sample", name)
            if process is not None:
                await self.finder.adopted_ready(link, process, lease)
            return
        self.starts.own(lease)
        await self._start(link, lease)

    def switch_broke(self, link: Link) -> None:
        """A request that switched the process's model got no answer (process_ends.py)."""
        self.ends.broke(link)

    async def _start(self, link: Link, lease: Lease) -> None:
        """Have the core start (or wake) the runtime under `lease`, and wait for the report."""
        name = link.consumer.name
        self.ends.starting(name)
        outcome = asyncio.get_running_loop().create_future()
        self.launches.outcomes[name] = outcome
        self.reports.start_process(lease)
        life = self.core.lifecycle(name)
        if life is None or life.state is not LifeState.STARTING or life.start_lease != lease.id:
            self.launches.outcomes.pop(name, None)
            self.leases.release(lease, failed=True)
            state = life.state.value if life is not None else "without a lifecycle"
            what = f"it could not be started: it is {state}"
            raise GateFailure(self.books.failure(link, FailureClass.RUNTIME_CRASH, what))
        await outcome

    # -- the gate's own start and stop -----------------------------------------------------

    def on_gate_start(self) -> None:
        """Start always_warm processes, adopt running ones, reserve uncontrolled ones."""
        for link in self.links.values():
            if self.books.envelope(link) is None:
                continue
            name = link.consumer.name
            if control_of(link) is not None and self._always_warm(link):
                # Under way from now: a request that arrives before its start begins waits.
                task = self._spawn(self._warm_start(link), f"process-{name}")
                self._warming[name] = task
            else:
                self._spawn(self._at_start(link), f"process-{name}")

    async def _warm_start(self, link: Link) -> None:
        with self.under_way.running(link.consumer.name):
            await self._at_start(link)

    async def _at_start(self, link: Link) -> None:
        await self.finder.read_unit(link)
        model = process_model(link.runtime.lifecycle)
        assert model is not None
        priority = link.runtime.settings.model_priority(model)
        process = control_of(link)
        try:
            if process is None:
                demand = self.books.demand(link, priority, gpu=self.books.shown_on(link))
                await self.leases.acquire(demand)
                return
            found = await self.finder.found(link, process)
            if self._always_warm(link) or found is LifeReport.FOUND_UP:
                await self.ensure_running(link, priority)
        except GateFailure as exc:
            self.launches.last_failure.setdefault(link.consumer.name, exc.failure.message)
            log.warning("%s at the gate's start: %s", link.consumer.name, exc.failure.message)

    async def warm(self) -> list[str]:
        """Wait for the always_warm processes the gate starts at its own start, each within
        its start timeout; what is not up then: `NAME not up: WHY`, one each."""
        names = sorted(self._warming)
        timeouts = {name: start_timeout_of(self.links[name]) for name in names}
        waits = [
            asyncio.wait_for(asyncio.shield(self._warming[name]), timeouts[name]) for name in names
        ]
        await asyncio.gather(*waits, return_exceptions=True)
        missing = []
        for name in names:
            life = self.core.lifecycle(name)
            if life is None or life.state is not LifeState.UP:
                queued = [t for t in self.core.waiting() if t.demand.consumer == name]
                wait = None
                if queued:
                    wait = f"{format_gib(queued[0].demand.envelope)} on GPU {queued[0].demand.gpu}"
                why = not_up(life, timeouts[name], self.launches.last_failure.get(name), wait)
                missing.append(f"{name} not up: {why}")
        return missing

    def _always_warm(self, link: Link) -> bool:
        model = process_model(link.runtime.lifecycle)
        return model is not None and (
            link.runtime.settings.residency(model).policy is ResidencyPolicy.ALWAYS_WARM
        )

    def _restart(self, link: Link) -> None:
        """After its process ended: an always_warm one starts again, after its backoff."""
        if self._always_warm(link):
            name = link.consumer.name
            retry = self.core.start_wait(name, self.clock())
            log.info("%s is always_warm: starting it again in %.1fs", name, retry)
            self._spawn(self._keep_warm(link), f"restart-{name}")

    def _warm_again(self, link: Link) -> None:
        """After a start that failed: an always_warm one starts again, after its backoff."""
        if self._always_warm(link):
            self._spawn(self._keep_warm(link), f"restart-{link.consumer.name}")

    async def _keep_warm(self, link: Link) -> None:
        """Start an always_warm process again after it ended, once its backoff allows."""
        name = link.consumer.name
        while True:
            await asyncio.sleep(self.core.start_wait(name, self.clock()))
            model = process_model(link.runtime.lifecycle)
            assert model is not None
            try:
                await self.ensure_running(link, link.runtime.settings.model_priority(model))
                return
            except GateFailure as exc:
                if exc.failure.failure_class is not FailureClass.START_BACKOFF:
                    log.warning("%s (always_warm) not started again: %s", name, exc.failure.message)

    async def close(self) -> None:
        """Stop background starts, and the processes the gate runs as its own children."""
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        for link in self.links.values():
            process = control_of(link)
            if isinstance(process, SupervisedCommand) and process.running:
                with contextlib.suppress(Exception):
                    await process.stop()

    def _spawn(self, coro, name: str) -> asyncio.Task[None]:  # type: ignore[no-untyped-def]
        task = asyncio.create_task(coro, name=f"gpugate-{name}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task
