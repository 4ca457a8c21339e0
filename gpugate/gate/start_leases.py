"""Start leases: VRAM admitted for a process start (`gpugate admit`) until NVML shows it held.

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

from gpugate.core.state import GateCore
from gpugate.core.tickets import Lease
from gpugate.gate.admission import Leases

log = logging.getLogger("gpugate.starts")


def materialised(core: GateCore, lease: Lease) -> bool:
    """Whether a sample newer than the grant shows the lease's owner holding its bytes."""
    budget = core.budget(lease.gpu)
    if budget is None or budget.sampled_at <= lease.granted:
        return False
    return budget.consumer(lease.key.consumer).observed >= lease.demand.envelope


class StartLeases:
    """The start leases being watched, by consumer; one watcher task each."""

    def __init__(self, core: GateCore, leases: Leases, sample_interval: float) -> None:
        """`core` is read (whether a lease is still held, what NVML shows); a lease whose
        process holds its bytes is released through `leases`, checked every
        `sample_interval`."""
        self.core = core
        self.leases = leases
        self.sample_interval = sample_interval
        self._by_consumer: dict[str, Lease] = {}
        self._tasks: set[asyncio.Task[None]] = set()

    def held(self, consumer: str) -> Lease | None:
        """The consumer's start lease still waiting for its process, if there is one."""
        lease = self._by_consumer.get(consumer)
        if lease is None or self.core.lease(lease.id) is None:
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
        consumer = lease.key.consumer
        try:
            while self.core.lease(lease.id) is not None:
                if materialised(self.core, lease):
                    log.info(
                        "start lease %d of %s materialised: its processes hold %d bytes",
                        lease.id, consumer, lease.demand.envelope,
                    )  # fmt: skip
                    self.leases.release(lease)
                    return
                await asyncio.sleep(self.sample_interval)
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
