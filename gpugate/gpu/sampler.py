"""Host observations: an NVML sample with every process attributed to its owner.

Reading NVML and /proc blocks, so it runs in a worker thread; the event loop only waits.
Reads never pile up: while one is running, every caller of `sample()` that arrives
shares the single read that starts right after it. A caller therefore always gets a
reading that began after it asked, which is what verifying an eviction needs, and two
NVML reads never overlap.

An observation is stamped when its read began: its figures come from calls made anywhere
between then and the end, so a read that hung for longer than `stale_after` is already
stale when it arrives and grants nothing. A hung read keeps its one worker thread; nobody
else starts one, and `close()` does not wait for it. A read in which a process nobody has
seen left /proc before it could be attributed is taken once more (`_exited_unknown`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import threading
import time
from collections.abc import Callable, Collection, Mapping
from typing import Protocol, cast

import attrs

from gpugate.config.model import Config
from gpugate.core.observation import (
    OTHER,
    DriverFault,
    GpuObservation,
    HostObservation,
    Owner,
    OwnerKind,
    ProcessUsage,
)
from gpugate.gpu.attribution import Attribution, MatchKind, ProcessAttributor
from gpugate.gpu.nvml import DeviceSample, HostSample, NvmlError, NvmlReader, library_from

_log = logging.getLogger("gpugate.sampler")

HURRY_EVERY = 0.05
"""Seconds between samples while memory is about to move (`Sampler.hurry`): an NVML read
and the /proc walk cost about a millisecond, so a few seconds of this cost little."""


class DeviceReader(Protocol):
    """What the sampler needs of NVML (`NvmlReader`, or a fake)."""

    def read(self) -> HostSample: ...

    def close(self) -> None: ...


class Attributor(Protocol):
    """What the sampler needs of process attribution (`ProcessAttributor`, or a fake)."""

    def attribute(self, pids: Collection[int]) -> Mapping[int, Attribution]: ...


class Sampler:
    """Turns NVML reads into `HostObservation`s, on demand or at a fixed interval."""

    def __init__(
        self,
        reader: DeviceReader,
        attributor: Attributor,
        *,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self.reader = reader
        self.attributor = attributor
        self._clock = clock
        self._wall_clock = wall_clock
        self._running: asyncio.Task[HostObservation] | None = None
        self._queued: asyncio.Task[HostObservation] | None = None
        self._poked: asyncio.Event | None = None
        self._hurry_until = -math.inf
        """Loop time until which `run()` samples every HURRY_EVERY seconds (see `hurry`)."""
        self.latest: HostObservation | None = None
        """The most recent observation, whoever asked for it."""
        self._closing = threading.Lock()
        self._closed = False
        self._observed: dict[int, _Observed] = {}
        """By GPU index, the last sample's device and what it was observed as."""
        self._owners: Mapping[int, Attribution] = {}
        """The last sample's attributions."""

    @classmethod
    def from_config(cls, config: Config) -> Sampler:
        """A sampler over the system's NVML and /proc, as the configuration says."""
        reader = NvmlReader(library_from(config.gate.nvml_library))
        return cls(reader, ProcessAttributor.from_config(config))

    def close(self) -> None:
        """Release NVML for good: a read still queued when the gate stops must not reopen it.

        Returns at once even while a read hangs in the driver: that read releases NVML
        when it ends.
        """
        self._closed = True
        self._release_if_closed()

    def _release_if_closed(self) -> None:
        if self._closed and self._closing.acquire(blocking=False):
            try:
                self.reader.close()
                # The attributor's pidfds; a fake attributor may hold nothing to close.
                close = getattr(self.attributor, "close", None)
                if close is not None:
                    close()
            finally:
                self._closing.release()

    # -- one sample --------------------------------------------------------------------

    def sample_blocking(self) -> HostObservation:
        """Read and attribute now, in this thread; a driver error is returned, not raised."""
        try:
            with self._closing:
                return self._sample_locked()
        finally:
            # A close() that came while this read ran could not take the lock.
            self._release_if_closed()

    def _sample_locked(self) -> HostObservation:
        taken_at, wall_time = self._clock(), self._wall_clock()
        if self._closed:
            fault = DriverFault(1, "Uninitialized", "the sampler is closed", call="read")
            return HostObservation(taken_at, wall_time, error=fault)
        for attempt in range(2):
            if attempt:
                taken_at, wall_time = self._clock(), self._wall_clock()
            try:
                host = self.reader.read()
            except NvmlError as exc:
                failed = HostObservation(taken_at, wall_time, error=exc.fault())
                self.latest = failed
                return failed
            pids = {p.pid for device in host.devices for p in device.processes}
            owners = self.attributor.attribute(pids)
            if not self._exited_unknown(owners):
                break
        devices = self._observe_all(host, owners)
        observation = HostObservation(taken_at, wall_time, devices, host.driver_version)
        self.latest = observation
        return observation

    def _exited_unknown(self, owners: Mapping[int, Attribution]) -> bool:
        """A process NVML listed left /proc before it could be read, unseen by any sample
        before: its owner is unknown, its bytes would read as `other`. The driver frees a
        process's memory as it exits, so a second read no longer lists it: a runner that
        exits between the two calls must not count twice (its model's books and `other`),
        which reads as pressure and evicts an idle model for nothing. A PID that stays out
        of /proc (another PID namespace) was seen by the sample before: not read twice."""
        return any(
            a.match is MatchKind.VANISHED and pid not in self._owners for pid, a in owners.items()
        )

    def _observe_all(
        self, host: HostSample, owners: Mapping[int, Attribution]
    ) -> tuple[GpuObservation, ...]:
        # An idle host reads the same as a sample ago (the reader hands back the very
        # same process records then, and cached attributions are the same objects, so
        # both compare at once): its last observation stands, sums by owner included.
        same_owners = owners == self._owners
        observed: dict[int, _Observed] = {}
        for device in host.devices:
            last = self._observed.get(device.index)
            if (
                same_owners
                and last is not None
                and last.device.processes is device.processes
                and last.device == device
            ):
                observed[device.index] = last
            else:
                observed[device.index] = _Observed(device, _observe(device, owners))
        self._observed, self._owners = observed, owners
        return tuple(o.observation for o in observed.values())

    async def sample(self) -> HostObservation:
        """A sample whose read began after this call; concurrent calls share one read."""
        task = self._queued
        if task is None:
            task = asyncio.get_running_loop().create_task(self._read_after(self._running))
            if self._running is None:
                self._running = task
            else:
                self._queued = task
        # A caller that gives up must not cancel the read others are waiting for.
        return await asyncio.shield(task)

    async def _read_after(self, previous: asyncio.Task[HostObservation] | None) -> HostObservation:
        me = cast("asyncio.Task[HostObservation]", asyncio.current_task())
        if previous is not None:
            await asyncio.wait([previous])
            self._queued = None
            self._running = me
        try:
            return await asyncio.to_thread(self.sample_blocking)
        finally:
            if self._running is me:
                self._running = None

    # -- sampling forever --------------------------------------------------------------

    def poke(self) -> None:
        """Ask `run()` for an extra sample now (e.g. while waiting for an eviction)."""
        if self._poked is not None:
            self._poked.set()

    def hurry(self, window: float) -> None:
        """Sample now and every HURRY_EVERY seconds for the next `window` seconds: memory
        is about to move (a runtime was asked to unload), and what comes back should be
        seen in a tenth of the interval, not at the next tick."""
        if self._poked is None:
            return
        until = asyncio.get_running_loop().time() + window
        self._hurry_until = max(self._hurry_until, until)
        self._poked.set()

    async def run(
        self,
        interval: float,
        on_sample: Callable[[HostObservation], None],
        *,
        on_error: Callable[[Exception], None] | None = None,
        max_backoff: float = 5.0,
    ) -> None:
        """Sample every `interval` seconds, and once more per `poke()`, until cancelled.

        Ticks stay on a fixed grid from the start, so slow reads do not add up to drift;
        a read longer than the interval skips the ticks it overran. A read or an
        `on_sample` that raises is handed to `on_error` (logged when there is none) and
        the loop goes on after a back-off that doubles per failure up to `max_backoff`.
        """
        if not interval > 0:
            raise ValueError(f"sample interval must be positive, not {interval!r}")
        loop = asyncio.get_running_loop()
        poked = self._poked = asyncio.Event()
        start = loop.time()
        failures = 0
        try:
            while True:
                poked.clear()
                try:
                    on_sample(await self.sample())
                except Exception as exc:
                    failures += 1
                    if on_error is not None:
                        on_error(exc)
                    else:
                        _log.warning("sampling failed: %r", exc)
                    backoff = min(max(interval, max_backoff), interval * 2 ** min(failures, 30))
                    await asyncio.sleep(backoff)
                    continue
                failures = 0
                now = loop.time()
                delay = next_delay(start, interval, now, self._hurry_until)
                if delay > 0 and not poked.is_set():
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout(delay):
                            await poked.wait()
        finally:
            if self._poked is poked:
                self._poked = None


def next_delay(start: float, interval: float, now: float, hurry_until: float) -> float:
    """Seconds to the next sample: the next tick on the grid, or HURRY_EVERY while a hurry
    lasts (never past the hurry's end, so the last hurried sample sees its whole window)."""
    delay = next_tick(start, interval, now) - now
    if now < hurry_until:
        delay = min(delay, HURRY_EVERY, max(hurry_until - now, 0.0))
    return delay


def next_tick(start: float, interval: float, now: float) -> float:
    """The first time on the grid start + k·interval that is after `now`."""
    ticks = math.floor((now - start) / interval) + 1
    return start + max(ticks, 1) * interval


def _observe(device: DeviceSample, owners: Mapping[int, Attribution]) -> GpuObservation:
    processes = []
    for p in device.processes:
        attribution = owners.get(p.pid)
        if attribution is None:
            # Only a fake attributor can leave a PID out; treat it as vanished.
            attribution = _vanished(p.pid)
        processes.append(
            ProcessUsage(p.pid, p.used, attribution.owner, attribution.name, p.kind.letters)
        )
    return GpuObservation(
        device.index,
        device.uuid,
        device.name,
        device.total,
        device.reserved,
        device.used,
        device.free,
        tuple(processes),
        device.process_fault,
    )


@attrs.frozen
class _Observed:
    device: DeviceSample
    observation: GpuObservation


def _vanished(pid: int) -> Attribution:
    return Attribution(pid, Owner(OwnerKind.EXTERNAL, OTHER), MatchKind.VANISHED)
