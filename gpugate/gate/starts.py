"""Process starts: the gate's own (a request found the process stopped) and `gpugate admit`'s.

A runtime whose memory is its process's (the adapter's `process_model`) is handled here:

* **Start on demand** (`ProcessStarts.serve_lease`): a request to such a consumer is
  forwarded under a 0-byte lease on the process's resident, which keeps it busy (never
  evicted while the request runs). When there is no resident, the process is stopped:
  the gate takes a PROCESS-scope lease for its envelope (it may wait, evict or fail like
  any demand), starts it through the adapter's control, waits for its port and health
  (`wait_ready`), and the request goes on. NVML turns the lease into the resident.
* **Eviction is a stop** (the adapter's `evict`), confirmed when NVML shows the
  consumer's memory gone; the next request starts it again.
* **At gate start** an `always_warm` process is started under a lease; one already
  running is adopted (a PROCESS lease its memory ends at the next sample); one with no
  control is reserved for its envelope until it shows.
* **One start, one lease**: while the gate holds the start lease of a process it is
  starting, `gpugate admit` from that process's unit (its ExecStartPre) joins that lease
  (`StartLeases.own`), and the gate waits for a start lease `gpugate admit` holds
  rather than taking a second one.

Start leases: VRAM admitted for a process start (`gpugate admit`) until NVML shows it held.

A runtime that loads its model at start and holds it until it exits is
admitted like a load: before its unit starts, `gpugate admit CONSUMER` takes an explicit
lease for the consumer's envelope whose ttl is the consumer's `start_admission_timeout`.
Nobody renews it. It ends one of two ways:

* **materialised**: a sample taken after the grant shows the consumer's processes holding
  at least the envelope. The lease is released; from then on the process's memory is
  counted as the consumer's `observed` bytes, like any resident process.
* **never materialised**: the process did not start, crashed, or holds less than its
  envelope. The core lapses the lease at its ttl (a `LEASE_TIMEOUT` failure event and a
  `lease_released` event with reason `expired`), and its bytes return.

While it is held, `committed = max(observed, pending + ...)` counts a loading process once.
The check runs every sample interval; the gate has no per-sample event to wait on. It is
deliberately small: a core PROCESS lease scope can take it over.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

import attrs

from gpugate.core.classes import PriorityClass, ResidencyPolicy
from gpugate.core.failures import Failure, FailureClass
from gpugate.core.residents import Resident, ResidentKey, ResidentState
from gpugate.core.tickets import Demand, Lease, LeaseScope
from gpugate.gate.links import GateFailure, Link
from gpugate.gate.owner import GateOwner
from gpugate.runtimes.process import (
    Exit,
    NotReady,
    ProcessControl,
    SupervisedCommand,
    wait_ready,
)

log = logging.getLogger("gpugate.starts")

DEFAULT_START_ADMISSION_TIMEOUT = 120.0
"""For a consumer without `control:` (its config default is the same)."""
POLL_INTERVAL = 0.05
"""How often a start waits for an unload or another start to end."""
ADOPT_FLOOR = 1024**2
"""The least a lease adopting a running process asks for (it must have bytes to appear)."""
ATTEMPTS = 3
"""Starts one request may ask for when the process keeps going away under it."""


def materialised(gate: GateOwner, lease: Lease) -> bool:
    """Whether a sample newer than the grant shows the lease's owner holding its bytes."""
    budget = gate.core.budget(lease.gpu)
    if budget is None or budget.sampled_at <= lease.granted:
        return False
    return budget.consumer(lease.key.consumer).observed >= lease.demand.envelope


class StartLeases:
    """The start leases being watched, by consumer; one watcher task each."""

    def __init__(self, gate: GateOwner) -> None:
        self.gate = gate
        self._by_consumer: dict[str, Lease] = {}
        self._tasks: set[asyncio.Task[None]] = set()

    def held(self, consumer: str) -> Lease | None:
        """The consumer's start lease still waiting for its process, if there is one."""
        lease = self._by_consumer.get(consumer)
        if lease is None or self.gate.core.lease(lease.id) is None:
            return None
        return lease

    def own(self, lease: Lease) -> None:
        """The gate holds `lease` for a start it runs itself: `admit` joins it. The core
        ends it (a PROCESS lease) once NVML shows the process."""
        self._by_consumer[lease.key.consumer] = lease

    def is_start(self, lease_id: int) -> bool:
        return any(x.id == lease_id for x in self._by_consumer.values())

    def watch(self, lease: Lease) -> None:
        """Release `lease` once its process holds its bytes (its ttl ends it otherwise)."""
        self._by_consumer[lease.key.consumer] = lease
        task = asyncio.create_task(self._watch(lease), name=f"gpugate-start-{lease.id}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _watch(self, lease: Lease) -> None:
        gate = self.gate
        consumer = lease.key.consumer
        try:
            while gate.core.lease(lease.id) is not None:
                if materialised(gate, lease):
                    log.info(
                        "start lease %d of %s materialised: its processes hold %d bytes",
                        lease.id, consumer, lease.demand.envelope,
                    )  # fmt: skip
                    gate.release(lease)
                    return
                await asyncio.sleep(gate.config.budget.sample_interval)
        finally:
            if self._by_consumer.get(consumer) is lease:
                del self._by_consumer[consumer]

    async def close(self) -> None:
        """Stop watching (the leases themselves end with the gate)."""
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            with contextlib.suppress(asyncio.CancelledError):
                await task


class ProcessStarts:
    """Processes the gate starts when a request needs them, and at its own start."""

    def __init__(self, gate: GateOwner) -> None:
        self.gate = gate
        self._locks: dict[str, asyncio.Lock] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        for link in gate.links.values():
            process = link.adapter.process
            if isinstance(process, SupervisedCommand):
                process.on_exit = lambda exit, link=link: self._exited(link, exit)

    def fronts(self, link: Link) -> bool:
        """Whether requests to `link` need its process running (a controlled process
        runtime with an envelope)."""
        return link.adapter.process is not None and self._envelope(link) is not None

    # -- requests --------------------------------------------------------------------------

    async def serve_lease(self, link: Link, priority: PriorityClass) -> Lease:
        """A 0-byte lease on the consumer's running process, started first if it is not."""
        gate = self.gate
        for _ in range(ATTEMPTS):
            await self.ensure_running(link, priority)
            resident = self._live(link)
            if resident is None:
                continue
            # No await between finding the resident and submitting the demand on it.
            lease = await gate.acquire(self._demand(link, priority, resident.key))
            if not lease.pending:
                return lease
            # The process went (evicted, crashed) while this request waited on it.
            gate.release(lease, failed=True)
        raise GateFailure(
            self._failure(link, FailureClass.RUNTIME_CRASH, "it kept stopping while starting")
        )

    async def ensure_running(self, link: Link, priority: PriorityClass) -> None:
        """Return once the books hold the consumer's process (loading or resident),
        starting it under a PROCESS lease when it is stopped."""
        gate = self.gate
        name = link.consumer.name
        async with self._locks.setdefault(name, asyncio.Lock()):
            deadline = gate.clock() + self._admission_timeout(link)
            while self._live(link) is None:
                if not self._going(link) and not self._admitted_elsewhere(link):
                    break
                if gate.clock() >= deadline:
                    what = "its stop or another start did not end in time"
                    raise GateFailure(self._failure(link, FailureClass.TIMEOUT, what))
                await asyncio.sleep(POLL_INTERVAL)
            else:
                return
            process = link.adapter.process
            running = process is None or await self._is_running(link, process)
            demand = self._demand(link, priority)
            if running:
                # Adopted: what NVML already shows of it is counted (as unexplained); the
                # lease covers the rest, so nothing is counted twice.
                shown = gate.core.telemetry.unexplained.get(demand.gpu, {}).get(name, 0)
                demand = attrs.evolve(demand, envelope=max(ADOPT_FLOOR, demand.envelope - shown))
            lease = await gate.acquire(demand)
            if running:
                log.info("%s is running: its memory is counted from the next sample", name)
                return
            assert process is not None
            gate.starts.own(lease)
            await self._start(link, process, lease)

    async def _start(self, link: Link, process: ProcessControl, lease: Lease) -> None:
        gate = self.gate
        control = link.consumer.control
        health = control.health if control is not None else "/health"
        timeout = control.start_timeout if control is not None else 60.0
        started = gate.clock()
        try:
            await process.start()
            await wait_ready(link.consumer.upstream.url, health, timeout, process=process)
        except Exception as exc:
            log.warning("%s could not be started: %s", link.consumer.name, exc)
            with contextlib.suppress(Exception):
                await process.stop()
            link.adapter.process_ended()
            gate.release(lease, failed=True)
            cls = FailureClass.TIMEOUT if isinstance(exc, NotReady) else FailureClass.RUNTIME_CRASH
            failure = self._failure(link, cls, f"its start failed: {exc}")
            gate.report(failure)
            raise GateFailure(failure) from exc
        log.info(
            "%s started under lease %d (%.1fs to ready)",
            link.consumer.name, lease.id, gate.clock() - started,
        )  # fmt: skip

    # -- the gate's own start and stop -----------------------------------------------------

    def on_gate_start(self) -> None:
        """Start always_warm processes, adopt running ones, reserve uncontrolled ones."""
        for link in self.gate.links.values():
            if self._envelope(link) is not None:
                self._spawn(self._at_start(link), f"process-{link.consumer.name}")

    async def _at_start(self, link: Link) -> None:
        adapter = link.adapter
        model = adapter.process_model()
        assert model is not None
        priority = adapter.model_priority(model)
        try:
            if adapter.process is None:
                await self.gate.acquire(self._demand(link, priority))
                return
            warm = adapter.residency(model).policy is ResidencyPolicy.ALWAYS_WARM
            if warm or await self._is_running(link, adapter.process):
                await self.ensure_running(link, priority)
        except GateFailure as exc:
            log.warning("%s at the gate's start: %s", link.consumer.name, exc.failure.message)

    async def close(self) -> None:
        """Stop background starts, and the processes the gate runs as its own children."""
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        for link in self.gate.links.values():
            process = link.adapter.process
            if isinstance(process, SupervisedCommand) and process.running:
                with contextlib.suppress(Exception):
                    await process.stop()

    # -- what happened to a process --------------------------------------------------------

    def _exited(self, link: Link, exit: Exit) -> None:
        """A process the gate runs ended on its own: a crash event; its start lease ends."""
        link.adapter.process_ended()
        tail = " | ".join(exit.stderr_tail[-3:])
        self.gate.report(
            self._failure(link, FailureClass.RUNTIME_CRASH, f"it exited: {exit.describe()}: {tail}")
        )
        for lease in self.gate.core.leases():
            mine = lease.key.consumer == link.consumer.name
            if mine and lease.scope is LeaseScope.PROCESS and lease.pending:
                self.gate.release(lease, failed=True)

    # -- the books -------------------------------------------------------------------------

    def _envelope(self, link: Link) -> int | None:
        model = link.adapter.process_model()
        return None if model is None else link.adapter.configured_envelope(model)

    def _live(self, link: Link) -> Resident | None:
        """The consumer's process in the books (loading or resident), its current model first."""
        current = link.adapter.process_model()
        found = None
        for resident in self.gate.core.residents(link.consumer.gpu):
            if resident.key.consumer != link.consumer.name or resident.state not in (
                ResidentState.RESIDENT,
                ResidentState.LOADING,
            ):
                continue
            if resident.key.model == current:
                return resident
            found = found or resident
        return found

    def _going(self, link: Link) -> bool:
        return any(
            r.key.consumer == link.consumer.name and r.state is ResidentState.UNLOADING
            for r in self.gate.core.residents(link.consumer.gpu)
        )

    def _admitted_elsewhere(self, link: Link) -> bool:
        """`gpugate admit` holds a start lease: the process is starting outside the gate."""
        held = self.gate.starts.held(link.consumer.name)
        return held is not None and held.demand.explicit

    def _demand(
        self, link: Link, priority: PriorityClass, key: ResidentKey | None = None
    ) -> Demand:
        """The process's start (PROCESS scope), or a request on its resident `key`."""
        adapter = link.adapter
        consumer = link.consumer
        model = adapter.process_model() if key is None else key.model
        assert model is not None
        envelope = adapter.configured_envelope(model) or self._envelope(link) or 0
        residency = adapter.residency(model)
        start = key is None
        return Demand(
            key=key or ResidentKey(consumer.name, model),
            gpu=consumer.gpu,
            envelope=envelope,
            priority=priority,
            resident_priority=adapter.model_priority(model),
            policy=residency.policy,
            idle_ttl=residency.idle_ttl,
            reload_seconds=adapter.reload_seconds(model, envelope),
            scope=LeaseScope.PROCESS if start else LeaseScope.REQUEST,
            appear_within=(
                consumer.control.start_admission_timeout
                if start and consumer.control is not None
                else None
            ),
        )

    def _admission_timeout(self, link: Link) -> float:
        control = link.consumer.control
        return control.start_admission_timeout if control else DEFAULT_START_ADMISSION_TIMEOUT

    async def _is_running(self, link: Link, process: ProcessControl) -> bool:
        try:
            return await process.is_running()
        except Exception as exc:
            what = f"its state is unknown: {exc}"
            raise GateFailure(self._failure(link, FailureClass.RUNTIME_CRASH, what)) from exc

    def _failure(self, link: Link, cls: FailureClass, what: str) -> Failure:
        consumer = link.consumer
        return Failure(
            cls,
            f"{cls.value}: {consumer.name} ({consumer.upstream.url}): {what}",
            consumer=consumer.name,
            model=link.adapter.process_model(),
            gpu=consumer.gpu,
        )

    def _spawn(self, coro, name: str) -> None:  # type: ignore[no-untyped-def]
        task = asyncio.create_task(coro, name=f"gpugate-{name}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
