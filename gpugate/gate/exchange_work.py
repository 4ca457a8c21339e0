"""The gate's side of a listener's request (a part of `Gate`): the runtime's own refusal
first, then the process the request needs running and kept busy, and a lease for what it
may load; the listener is handed an `Exchange` (exchange.py) that knows the rest."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, cast

import aiohttp
import attrs

from gpugate.core.classes import PriorityClass
from gpugate.core.placement import PlacementRule, Placing
from gpugate.core.residents import ResidentKey
from gpugate.core.tickets import Demand, Lease, LeaseScope, Started
from gpugate.gate.exchange import Caller, Exchange, Trial
from gpugate.gate.links import GateFailure, Link
from gpugate.gate.owner import ExchangeOwner, ProcessFront
from gpugate.logs import OncePerInterval
from gpugate.runtimes.base import AdapterError, Classified, Measured, RouteKind, Vetted

unvetted = OncePerInterval(logging.getLogger("gpugate.listener"), 60.0)


class ExchangeWork:
    """The gate's side of a listener's request (a part of `Gate`)."""

    clock: Callable[[], float]

    if TYPE_CHECKING:  # Gate provides these
        processes: ProcessFront

        async def acquire(self, demand: Demand) -> Lease: ...

        async def acquire_on(
            self,
            demand: Demand,
            gpus: Sequence[int],
            *,
            placing: Placing = Placing.GATE,
            rule: PlacementRule | None = None,
        ) -> tuple[Lease, ...]: ...

        def lease_now_on(
            self,
            demand: Demand,
            gpus: Sequence[int],
            *,
            placing: Placing = Placing.GATE,
            rule: PlacementRule | None = None,
        ) -> tuple[Lease, ...] | None: ...

        def early_start(self, consumer: str, gpus: Sequence[int]) -> Started: ...

        def release(self, lease: Lease, *, failed: bool = False) -> None: ...

        def ceiling(self, consumer: str, gpu: int, priority: PriorityClass) -> int | None: ...

        def measured_job(self, kind: ResidentKey) -> Measured | None: ...

        def known_envelope(self, link: Link, model: str, options: str) -> int | None: ...

        async def envelope(self, link: Link, model: str, options: str) -> int | None: ...

    async def admit(
        self, link: Link, classified: Classified, caller: Caller, method: str, path: str
    ) -> Exchange:
        """Admit one request: the runtime's own refusal first (`Exchange.refusal`), then the
        process it needs running and kept busy, and a lease for what it may load. Raises
        GateFailure, with nothing held, when either cannot be had."""
        gate = cast(ExchangeOwner, self)
        trial = False
        if classified.kind is RouteKind.DEMAND and link.adapter.vets:
            vetted = await self._vet(link, classified)
            if vetted is not None:
                if vetted.reply is not None:
                    return Exchange(gate, link, classified, method, path, vetted.reply)
                if vetted.runtime_decides and classified.scope is LeaseScope.JOB:
                    trial = True
                else:
                    # The runtime refuses it before loading: it goes up unleased.
                    classified = attrs.evolve(classified, kind=RouteKind.PASS)
        adapter = link.adapter
        exchange = Exchange(gate, link, classified, method, path, caller=caller)
        processes = self.processes
        if processes.fronts(link):
            needed = adapter.needs_process(method, path)
            if not needed:
                # Forwarded as it is while the process runs; a start under way is waited
                # for; in place of a stopped process the gate answers its health route,
                # and any other request starts it (process_absent.py).
                await processes.settle(link)
                if processes.absent(link):
                    stood = processes.stand_in(link, method, path, classified.api)
                    if stood is not None:
                        return Exchange(gate, link, classified, method, path, stood)
                    needed = True
            if needed:
                # It must run (the gate starts it if it was stopped), and it stays busy,
                # never evicted, while this request is in flight.
                exchange.busy = await processes.serve_lease(link, exchange.process_priority())
        if classified.kind is RouteKind.DEMAND:
            try:
                leases = await self._lease(link, classified, caller, exchange, trial=trial)
            except GateFailure:
                if exchange.busy is not None:
                    self.release(exchange.busy)
                raise
            if leases:
                exchange.lease, exchange.parts = leases[0], leases[1:]
            exchange.failed = any(lease.pending > 0 for lease in leases)
        return exchange

    async def _vet(self, link: Link, classified: Classified) -> Vetted | None:
        """The runtime's own refusal of a demand, before any lease (None: admit it). A
        runtime that cannot be asked in time only means the demand is admitted unvetted."""
        assert link.session is not None
        try:
            # The adapter bounds its own calls (timeouts.control): an answer it already
            # has costs no timer here.
            return await link.adapter.vet(classified, link.session, self.clock())
        except (TimeoutError, aiohttp.ClientError, AdapterError, OSError) as exc:
            unvetted.warning(
                f"{link.consumer.name}:{type(exc).__name__}",
                "%s: admitted a request unvetted; the runtime could not say whether it "
                "would refuse it (%s: %s)",
                link.consumer.name,
                type(exc).__name__,
                exc,
            )
            return None

    async def _lease(
        self,
        link: Link,
        classified: Classified,
        caller: Caller,
        exchange: Exchange,
        *,
        trial: bool = False,
    ) -> tuple[Lease, ...]:
        """The leases for a request that may load a model: one, or one per GPU a split
        load spans (none: the runtime will refuse it, or it goes up on `trial`).

        On trial (a job only the runtime can judge), it is leased now only from memory
        nobody waits for, evicting nobody; otherwise it goes up with no lease, marked with
        what its consumer held beyond the books before it went up, and `Exchange.trial`
        leases it once the runtime has accepted it (`gpugate.core.early`)."""
        demand = await self._demand(link, classified, caller)
        if demand is None:
            return ()
        consumer = link.consumer
        cards = consumer.cards
        # The runtime's rule matters only where there is a choice: not on a one-card consumer's
        # every request.
        rule = link.adapter.placement_rule(classified) if len(cards) > 1 else None
        placing = link.adapter.placing
        if not trial:
            return await self.acquire_on(demand, cards, placing=placing, rule=rule)
        leases = self.lease_now_on(demand, cards, placing=placing, rule=rule)
        if leases is not None:
            return leases
        started = attrs.evolve(demand, started=self.early_start(consumer.name, cards))
        exchange.trial = Trial(started, tuple(cards), placing, rule)
        return ()

    async def _demand(self, link: Link, classified: Classified, caller: Caller) -> Demand | None:
        """What a request that may load a model demands (None: no envelope is known, the
        runtime will refuse it)."""
        assert classified.model is not None
        adapter = link.adapter
        consumer = link.consumer
        model = classified.model
        key = ResidentKey(consumer.name, model, classified.options_key)
        envelope = None
        model_class = adapter.model_priority(model)
        priority = caller.priority(model_class)
        if adapter.sizes_requests:
            ceilings = [self.ceiling(consumer.name, gpu, priority) for gpu in consumer.cards]
            known = [c for c in ceilings if c is not None]
            envelope = adapter.size(classified, self.measured_job(key), max(known, default=None))
        if envelope is None:
            envelope = self.known_envelope(link, model, classified.options_key)
        if envelope is None:
            envelope = await self.envelope(link, model, classified.options_key)
        if envelope is None:
            return None
        residency = adapter.residency(model)
        return Demand(
            key=key,
            gpu=consumer.cards[0],
            envelope=envelope,
            priority=priority,
            resident_priority=model_class,
            policy=residency.policy,
            idle_ttl=classified.idle_ttl,
            reload_seconds=adapter.reload_seconds(model, envelope),
            sets_ttl=classified.sets_ttl,
            scope=classified.scope,
            appear_within=classified.appear_within,
            replaces=(
                ResidentKey(consumer.name, classified.replaces) if classified.replaces else None
            ),
            # The runtime's memory is its process's: a PROCESS demand of a request switches
            # the running process's model, and its answer ends the lease.
            switch=classified.scope is LeaseScope.PROCESS and adapter.process_model() is not None,
            most_models=adapter.most_models,
        )
