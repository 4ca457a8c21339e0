"""Ollama's scheduler, simulated: loaded runners, one load at a time, keep_alive, eviction.

The rules follow Ollama's server/sched.go:

* A request for a loaded model whose runner options match bypasses the queue and shares
  the runner (up to `num_parallel` generating at once; the rest wait for a slot).
* Every other request joins the pending queue (at most `max_queue`, else 503) and the
  scheduler serves it alone: reload on different runner options, place it on the GPUs
  Ollama sees (gpugate_sim.ollama.placement), evict to make room on them (idle runners
  first, shortest keep_alive first, then by model path, as `findRunnerToUnload`), and
  load; the runner lays the model over its GPUs (gpugate_sim.ollama.layout). With nothing
  else loaded a model that does not fit loads anyway with part of it in system memory
  (`size_vram < size`).
* A load whose runner runs out of memory is tried once more, with a lower automatic
  context and every other model evicted first (gpugate_sim.ollama.oomretry).
* A runner's keep_alive counts down from the moment its last request ends; it is only
  replaced by a request that carries one. Duration 0 unloads right after that request.

Everything here runs on one event loop and decides without awaiting between a read of
the state and the change it gates; the awaits are only on child processes and events.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import os
import time
from collections.abc import Callable
from datetime import datetime, timedelta

import attrs

from gpugate_sim.device import SimulatedGpuHost
from gpugate_sim.ollama.catalog import CatalogModel
from gpugate_sim.ollama.duration import FOREVER, parse_keep_alive_setting, seconds
from gpugate_sim.ollama.faults import SimFaults
from gpugate_sim.ollama.loading import prepare
from gpugate_sim.ollama.oomretry import retry_options
from gpugate_sim.ollama.options import (
    RequestOptions,
    requested_gpu_share,
    runner_size,
)
from gpugate_sim.ollama.placement import LoadPlan, plan_load
from gpugate_sim.ollama.process import LoadOutcome, RunnerProcess
from gpugate_sim.ollama.runnerref import (
    Lease,
    LoadFailed,
    QueueFull,
    Runner,
    find_runner_to_unload,
    own_bytes,
)
from gpugate_sim.ollama.state import Counters, RunnerPhase, SimState
from gpugate_sim.scenario import OllamaSpec


@attrs.define(eq=False)
class Pending:
    model: CatalogModel
    options: RequestOptions
    keep_alive: int | None
    future: asyncio.Future[Runner]
    abandoned: asyncio.Event = attrs.field(factory=asyncio.Event)
    oom_retry_attempted: bool = False
    """sched.go `LlmRequest.oomRetryAttempted`: its one retry after a load OOM is spent."""


class Scheduler:
    """Owns every runner of one simulated Ollama."""

    def __init__(
        self,
        spec: OllamaSpec,
        gpu: SimulatedGpuHost,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._spec = spec
        self._gpu = gpu
        self._clock = clock
        self.default_keep_alive = parse_keep_alive_setting(spec.keep_alive)
        self.counters = Counters()
        self.faults = SimFaults.from_spec(spec.faults)
        self._runners: dict[str, Runner] = {}
        self._loading: Runner | None = None
        self._current: Pending | None = None
        self._queue: collections.deque[Pending] = collections.deque()
        self._wake = asyncio.Event()
        self._changed = asyncio.Event()
        self._tasks: set[asyncio.Task[None]] = set()
        self._loop_task: asyncio.Task[None] | None = None
        self._devices: tuple[int, ...] | None = None

    @property
    def devices(self) -> tuple[int, ...]:
        """The host GPUs this Ollama sees, in its device order."""
        if self._devices is None:
            self._devices = self._spec.devices(len(self._gpu.read().devices))
        return self._devices

    # -- requests ------------------------------------------------------------------------

    def start(self) -> None:
        if self._loop_task is None:
            self._loop_task = asyncio.create_task(self._run(), name="sim-ollama-scheduler")

    async def acquire(
        self, model: CatalogModel, options: RequestOptions, keep_alive: int | None
    ) -> Lease:
        """A runner for this request, loading (and evicting) as needed.

        Raises QueueFull or LoadFailed. Cancelling the caller abandons a queued request
        and aborts a load in progress that was started for it.
        """
        loop = asyncio.get_running_loop()
        started = loop.time()
        runner = self._runners.get(model.name.key)
        if runner is not None and runner.serves(options.runner, options.num_ctx_auto):
            self._use(runner, keep_alive)
            return Lease(runner, int((loop.time() - started) * 1e9))
        if len(self._queue) >= self._spec.max_queue:
            raise QueueFull()
        pending = Pending(model, options, keep_alive, loop.create_future())
        self._queue.append(pending)
        self._wake.set()
        self.changed()
        try:
            runner = await pending.future
        except asyncio.CancelledError:
            pending.abandoned.set()
            future = pending.future
            if future.done() and not future.cancelled() and future.exception() is None:
                self.release(Lease(future.result(), 0))
            with contextlib.suppress(ValueError):
                self._queue.remove(pending)
            self.changed()
            raise
        return Lease(runner, int((loop.time() - started) * 1e9))

    def release(self, lease: Lease) -> None:
        """The request is over: drop the refcount; the last one starts the keep_alive."""
        runner = lease.runner
        runner.refcount -= 1
        if runner.refcount == 0:
            if runner.draining or runner.phase is not RunnerPhase.READY:
                runner.idle.set()
            else:
                self._start_keep_alive(runner)
        self.changed()

    def expire(self, model: CatalogModel) -> None:
        """The unload shortcut: keep_alive 0 now; unloads when (or once) idle."""
        runner = self._runners.get(model.name.key)
        if runner is None or runner.phase is not RunnerPhase.READY:
            return
        runner.cancel_timer()
        runner.keep_alive = 0
        runner.expires_at = self._now()
        if runner.refcount == 0 and not runner.draining:
            self._begin_unload(runner)
        self.changed()

    # -- observation ---------------------------------------------------------------------

    def loaded(self) -> list[Runner]:
        """Runners that are loaded, in load order."""
        return [r for r in self._runners.values() if r.phase is RunnerPhase.READY]

    def listed(self) -> list[Runner]:
        """What /api/ps lists: loaded runners, and those whose unload is under way (Ollama
        deletes a runner from `s.loaded` only once `Close` has reaped its process)."""
        return [
            r
            for r in self._runners.values()
            if r.phase in (RunnerPhase.READY, RunnerPhase.UNLOADING)
        ]

    def expires_at(self, runner: Runner) -> datetime:
        """/api/ps `expires_at`: the deadline of an idle runner, an estimate for a busy one."""
        if runner.refcount == 0 and runner.expires_at is not None:
            return runner.expires_at
        return self._now(runner.keep_alive)

    def snapshot(self) -> SimState:
        runners = list(self._runners.values())
        if self._loading is not None:
            runners.append(self._loading)
        return SimState(
            runners=tuple(r.info() for r in runners),
            counters=self.counters.copy(),
            pending=len(self._queue),
        )

    def changed(self) -> None:
        """Wake everything waiting in `wait_until`."""
        event, self._changed = self._changed, asyncio.Event()
        event.set()

    async def wait_until(
        self, predicate: Callable[[SimState], bool], timeout: float = 10.0
    ) -> SimState:
        """Wait for a state that satisfies `predicate` (TimeoutError after `timeout`)."""
        async with asyncio.timeout(timeout):
            while True:
                event = self._changed
                state = self.snapshot()
                if predicate(state):
                    return state
                await event.wait()

    # -- shutdown ------------------------------------------------------------------------

    async def close(self) -> None:
        """Stop scheduling and kill every runner child, waiting for each to exit."""
        current = self._current
        if self._loop_task is not None:
            self._loop_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._loop_task
            self._loop_task = None
        for pending in [*self._queue, *([current] if current else [])]:
            pending.future.cancel()
        self._queue.clear()
        victims = list(self._runners.values())
        if self._loading is not None:
            victims.append(self._loading)
            self._loading = None
        for runner in victims:
            runner.cancel_timer()
            if runner.process is not None:
                await runner.process.kill()
            self._forget(runner)
        for task in list(self._tasks):
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self.changed()

    # -- the scheduling loop -------------------------------------------------------------

    async def _run(self) -> None:
        while True:
            if not self._queue:
                self._wake.clear()
                await self._wake.wait()
                continue
            pending = self._queue.popleft()
            self.changed()
            if pending.abandoned.is_set() or pending.future.done():
                continue
            self._current = pending
            try:
                await self._serve(pending)
            except Exception as exc:  # a broken state file must fail the request, not us
                if not pending.future.done():
                    pending.future.set_exception(LoadFailed(str(exc)))
            finally:
                self._current = None

    async def _serve(self, pending: Pending) -> None:
        key = pending.model.name.key
        while not pending.abandoned.is_set():
            unloading = [r for r in self._runners.values() if r.phase is RunnerPhase.UNLOADING]
            if unloading:
                # sched.go `processCompleted` holds loadedMu from an unload's Kill to its
                # delete from s.loaded, so `processPending` never plans beside a runner whose
                # memory is back but which is still listed (it would evict another for it).
                await asyncio.gather(*(r.gone.wait() for r in unloading))
                continue
            current = self._runners.get(key)
            if current is not None:
                if current.serves(pending.options.runner, pending.options.num_ctx_auto):
                    self._grant(pending, current)
                    return
                await self._evict(current)
                continue
            others = list(self._runners.values())
            if len(others) >= self._spec.loaded_limit(len(self.devices)):
                await self._evict(find_runner_to_unload(others))
                continue
            options = pending.options.runner
            parallel = 1 if pending.model.spec.embedding else self._spec.num_parallel
            size = runner_size(pending.model, options, parallel)
            explicit = requested_gpu_share(pending.model, options, size)
            plan = plan_load(
                self._gpu.read(), self.devices, own_bytes(self._runners.values()), size,
                num_gpu=options.num_gpu, main_gpu=options.main_gpu,
                spread=self._spec.sched_spread,
            )  # fmt: skip
            # sched.go `load`: beside other runners, the chosen GPUs must hold it all (Ollama
            # at fb30760 asks 80 % of it; the full fit is v0.24.0's, kept for one GPU).
            if explicit is None and size > plan.available and others and plan.placement.gpus:
                await self._evict(find_runner_to_unload(others))
                continue
            if await self._load(pending, size, explicit, plan):
                # sched.go `processPending`: the one retry after a load OOM, with every other
                # model evicted first (`evictAllAndWait`) when there are any.
                await asyncio.gather(
                    *(self._evict(r) for r in list(self._runners.values()) if r.key != key)
                )
                continue
            return

    async def _evict(self, runner: Runner) -> None:
        if runner.phase is not RunnerPhase.READY:
            await runner.gone.wait()
            return
        runner.draining = True
        runner.cancel_timer()
        self.changed()
        while runner.refcount > 0:
            runner.idle.clear()
            await runner.idle.wait()
        await self._unload(runner)

    async def _load(
        self, pending: Pending, size: int, explicit: int | None, plan: LoadPlan
    ) -> bool:
        """Start a runner for `pending` and wait for it; True when its load ran out of
        memory and sched.go `load` would try once more (`retry_after_oom`)."""
        keep_alive = self.default_keep_alive if pending.keep_alive is None else pending.keep_alive
        runner, command = prepare(
            self._spec, self._gpu.directory, pending.model, pending.options, keep_alive,
            size=size, explicit=explicit, plan=plan,
        )  # fmt: skip
        self._loading = runner
        try:
            runner.process = await RunnerProcess.spawn(command)
            self.changed()
            outcome = await runner.process.wait_ready(pending.abandoned)
        except OSError as exc:
            self._loading = None
            self.counters.load_failures += 1
            self._fail(pending, f"llama runner process has terminated: {exc}")
            return False
        self._loading = None
        if outcome is LoadOutcome.READY:
            runner.phase = RunnerPhase.READY
            self._runners[runner.key] = runner
            self.counters.loads += 1
            if pending.future.done():
                self._start_keep_alive(runner)
            else:
                self._grant(pending, runner)
        elif outcome is LoadOutcome.ABANDONED:
            await runner.process.kill()
            self._forget(runner)
            self.counters.loads_aborted += 1
        else:
            reason = await runner.process.failure()
            self._forget(runner)
            self.counters.load_failures += 1
            if self._retry_after_oom(pending, reason):
                self.counters.oom_retries += 1
                self.changed()
                return True
            self._fail(pending, f"llama runner process has terminated: {reason}")
        self.changed()
        return False

    def _retry_after_oom(self, pending: Pending, reason: str) -> bool:
        """Whether the failed load of `pending` is tried once more (oomretry.py), with the
        options it is tried with; the caller evicts every other model first."""
        if pending.oom_retry_attempted:
            return False
        others = any(r.key != pending.model.name.key for r in self._runners.values())
        options = retry_options(pending.model, pending.options, reason, others)
        if options is None:
            return False
        pending.oom_retry_attempted = True
        pending.options = options
        return True

    # -- runner bookkeeping --------------------------------------------------------------

    def _grant(self, pending: Pending, runner: Runner) -> None:
        if pending.future.done():
            return
        self._use(runner, pending.keep_alive)
        pending.future.set_result(runner)

    def _fail(self, pending: Pending, message: str) -> None:
        if not pending.future.done():
            pending.future.set_exception(LoadFailed(message))

    def _use(self, runner: Runner, keep_alive: int | None) -> None:
        runner.cancel_timer()
        if keep_alive is not None:
            runner.keep_alive = keep_alive
        runner.refcount += 1
        runner.expires_at = None
        runner.idle.clear()
        self.changed()

    def _start_keep_alive(self, runner: Runner) -> None:
        if runner.keep_alive <= 0:
            self._begin_unload(runner)
            return
        runner.expires_at = self._now(runner.keep_alive)
        if runner.keep_alive < FOREVER:
            loop = asyncio.get_running_loop()
            runner.timer = loop.call_later(seconds(runner.keep_alive), self._expired, runner)

    def _expired(self, runner: Runner) -> None:
        runner.timer = None
        if runner.refcount == 0 and runner.phase is RunnerPhase.READY and not runner.draining:
            self._begin_unload(runner)

    def _begin_unload(self, runner: Runner) -> None:
        task = asyncio.create_task(self._unload(runner))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _unload(self, runner: Runner) -> None:
        if runner.phase is not RunnerPhase.READY:
            await runner.gone.wait()
            return
        runner.phase = RunnerPhase.UNLOADING
        runner.cancel_timer()
        self.changed()
        if self.faults.keep_memory:
            self._keep_memory(runner)
        if runner.process is not None:
            await runner.process.kill()
        if self.faults.reap_seconds > 0:
            # Its memory is back; Ollama still lists it until its Close returns.
            await asyncio.sleep(self.faults.reap_seconds)
        self._forget(runner)
        self.counters.unloads += 1
        self.changed()

    def _keep_memory(self, runner: Runner) -> None:
        # The server process takes the runner's bytes over, so they outlive the runner.
        if runner.process is not None:
            self.faults.leaked += self._gpu.transfer(runner.process.pid, os.getpid())

    def _forget(self, runner: Runner) -> None:
        if self._runners.get(runner.key) is runner:
            del self._runners[runner.key]
        runner.phase = RunnerPhase.GONE
        runner.gone.set()
        runner.idle.set()

    def _now(self, plus_ns: int = 0) -> datetime:
        moment = datetime.fromtimestamp(self._clock()).astimezone()
        return moment + timedelta(microseconds=max(0, plus_ns) // 1000)
