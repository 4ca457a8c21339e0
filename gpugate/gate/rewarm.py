"""Warm again: the gate's side of `gpugate.core.rewarm`.

The core remembers what was evicted for a higher class and says, when asked, which models
to load again now. The gate asks after each sample (`check`), when memory may have come
back, and carries each rewarm out through the normal lease path: the rewarm's ticket is
waited on like a request's (`Leases.wait_for`), and under its lease the runtime is asked to
load the model with nothing to run (`Residents.warm`); its answer completes the load
(`Leases.loaded`), and the lease ends at once, leaving an idle resident that expires when
its time-to-live would have, had it never been evicted.

A rewarm a real demand cancels wakes here with its failure; one the runtime does not load
ends its lease as failed (the core drops the resident it was loading).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine, Mapping, Sequence
from typing import Any, Protocol

from gpugate.config.model import ModelOverride
from gpugate.core.classes import ResidencyPolicy
from gpugate.core.effects import Effect
from gpugate.core.residents import ResidentKey
from gpugate.core.rewarm import RewarmOutcome
from gpugate.core.rewarm_plan import due, start
from gpugate.core.state import GateCore
from gpugate.core.tickets import Demand, Lease
from gpugate.gate.admission import Leases
from gpugate.gate.failure import GateFailure
from gpugate.gate.link import Link

log = logging.getLogger("gpugate.rewarm")


class Owner(Protocol):
    def apply(self, effects: Sequence[Effect], *, timers: bool = True) -> None: ...


class Rewarms:
    """Starts the rewarms the core says are due, and carries each out to its end."""

    def __init__(
        self,
        core: GateCore,
        links: Mapping[str, Link],
        leases: Leases,
        clock: Callable[[], float],
        owner: Owner,
        spawn: Callable[[Coroutine[Any, Any, None], str], None],
    ) -> None:
        self.core = core
        self.links = links
        self.leases = leases
        self.clock = clock
        self.owner = owner
        self.spawn = spawn
        core.rewarms.wants = self.wants

    def wants(self, key: ResidentKey, policy: ResidencyPolicy) -> bool:
        """A model is warmed again when its runtime can load it when asked and its setting
        (`rewarm`, by default on for always_warm only) says so."""
        link = self.links.get(key.consumer)
        if link is None or not link.runtime.residents.warms:
            return False
        settings = link.runtime.settings
        override = settings.override(key.model) or ModelOverride(key.model)
        return override.rewarms(settings.residency(key.model))

    def check(self) -> None:
        """Start every rewarm that is due now (the core decides, in this one call)."""
        if not self.core.rewarms.evicted:
            return
        now = self.clock()
        # Each start changes the books the next is planned against: ask again after it.
        for _ in range(len(self.core.rewarms.evicted)):
            chosen = due(self.core, now)
            if not chosen:
                return
            for demand in chosen:
                admission = start(self.core, demand, now)
                if admission.failure is not None:
                    self.owner.apply(admission.effects)
                    continue
                lease = self.leases.follow(admission)
                self.spawn(
                    self._carry_out(demand, admission.ticket_id, lease), f"rewarm-{demand.key}"
                )

    async def _carry_out(
        self, demand: Demand, ticket_id: int, leased: Coroutine[Any, Any, Lease]
    ) -> None:
        try:
            lease = await leased
        except GateFailure as exc:
            # Cancelled for a real demand (its event said so already), or timed out.
            self._finished(ticket_id, RewarmOutcome.FAILED, exc.failure.message)
            return
        except asyncio.CancelledError:
            self._finished(ticket_id, RewarmOutcome.CANCELLED, "the gate stops")
            raise
        link = self.links.get(demand.consumer)
        loaded = False
        why = ""
        try:
            if link is None or link.session is None:
                raise LookupError(f"no runtime can load {demand.key}")
            residents = link.runtime.residents
            async with asyncio.timeout(residents.warm_timeout()):
                await residents.warm(link.session, demand.model, demand.idle_ttl)
            loaded = True
        except asyncio.CancelledError:
            why = "the gate stops"
            raise
        except Exception as exc:
            why = f"the runtime did not load it: {exc}"
            log.warning("rewarm of %s: %s", demand.key, why)
        finally:
            if loaded:
                self.leases.loaded(lease)
            self.leases.release(lease, failed=not loaded)
            outcome = RewarmOutcome.DONE if loaded else RewarmOutcome.FAILED
            self._finished(ticket_id, outcome, why or "loaded")

    def _finished(self, ticket_id: int, outcome: RewarmOutcome, why: str) -> None:
        self.owner.apply(
            self.core.rewarms.finished(self.core, ticket_id, outcome, self.clock(), why)
        )
