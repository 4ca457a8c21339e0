"""A listener's requests, as the gate admits them: the listener asks once (`admit`) and is
handed an `Exchange` (exchange.py). Admission runs the runtime's own refusal first (its
`Vetting`), then starts the process a request needs and keeps it busy (its `Lifecycle`),
then leases what the request may load: sized by the runtime's `Memory` part from the
request, else configured, measured or estimated from the model (the envelope book, which
takes that part too), and placed among
the consumer's GPUs by the runtime's rule (its `Placement`) or by the gate.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import aiohttp
import attrs

from gpugate.core.residents import ResidentKey
from gpugate.core.state import GateCore
from gpugate.core.tickets import Demand, Lease, LeaseScope
from gpugate.gate.envelopes import EnvelopeBook, cards_of, sizing_of
from gpugate.gate.exchange import Caller, Exchange, ExchangeOwner, Trial
from gpugate.gate.failure import GateFailure
from gpugate.gate.link import Link
from gpugate.logs import OncePerInterval
from gpugate.runtimes.base import (
    AdapterError,
    Classified,
    Measured,
    RouteKind,
    Vetted,
    Vetting,
)
from gpugate.runtimes.base import placing as placing_of
from gpugate.runtimes.footprint import Footprint

unvetted = OncePerInterval(logging.getLogger("gpugate.listener"), 60.0)


class Requests:
    """The gate's side of a listener's requests; the `Bounds` a runtime that sizes a
    request from its body reads."""

    def __init__(
        self,
        owner: ExchangeOwner,
        envelopes: EnvelopeBook,
        core: GateCore,
        clock: Callable[[], float],
    ) -> None:
        self.owner = owner
        self.envelopes = envelopes
        self.core = core
        self.clock = clock

    async def admit(
        self, link: Link, classified: Classified, caller: Caller, method: str, path: str
    ) -> Exchange:
        """Admit one request: the runtime's own refusal first (`Exchange.refusal`), then the
        process it needs running and kept busy, and a lease for what it may load. Raises
        GateFailure, with nothing held, when either cannot be had."""
        gate = self.owner
        trial = False
        vetting = link.runtime.vetting
        if classified.kind is RouteKind.DEMAND and vetting is not None:
            vetted = await self._vet(link, vetting, classified)
            if vetted is not None:
                if vetted.reply is not None:
                    return Exchange(gate, link, classified, method, path, vetted.reply)
                if vetted.runtime_decides and classified.scope is LeaseScope.JOB:
                    trial = True
                else:
                    # The runtime refuses it before loading: it goes up unleased.
                    classified = attrs.evolve(classified, kind=RouteKind.PASS)
        exchange = Exchange(gate, link, classified, method, path, caller=caller)
        processes = gate.processes
        lifecycle = link.runtime.lifecycle
        if lifecycle is not None and processes.fronts(link):
            needed = lifecycle.needs_process(method, path)
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
                    gate.leases.release(exchange.busy)
                raise
            if leases:
                exchange.lease, exchange.parts = leases[0], leases[1:]
            exchange.failed = any(lease.pending > 0 for lease in leases)
        return exchange

    async def _vet(self, link: Link, vetting: Vetting, classified: Classified) -> Vetted | None:
        """The runtime's own refusal of a demand, before any lease (None: admit it). A
        runtime that cannot be asked in time only means the demand is admitted unvetted."""
        assert link.session is not None
        try:
            # The runtime bounds its own calls (timeouts.control): an answer it already
            # has costs no timer here.
            return await vetting.vet(classified, link.session, self.clock())
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
        placement = link.runtime.placement
        rule = placement.placement_rule(classified) if placement and len(cards) > 1 else None
        placing = placing_of(placement)
        leases = self.owner.leases
        if not trial:
            return await leases.acquire_on(demand, cards, placing=placing, rule=rule)
        now = leases.lease_now_on(demand, cards, placing=placing, rule=rule)
        if now is not None:
            return now
        started = attrs.evolve(demand, started=leases.early_start(consumer.name, cards))
        exchange.trial = Trial(started, tuple(cards), placing, rule)
        return ()

    async def _demand(self, link: Link, classified: Classified, caller: Caller) -> Demand | None:
        """What a request that may load a model demands (None: no envelope is known, the
        runtime will refuse it)."""
        assert classified.model is not None
        settings = link.runtime.settings
        memory = link.runtime.memory
        consumer = link.consumer
        model = classified.model
        key = ResidentKey(consumer.name, model, classified.options_key)
        model_class = settings.model_priority(model)
        priority = caller.priority(model_class)
        footprint = memory.size(classified, key, priority, self)
        if footprint is None:
            known = self.envelopes.known(consumer.name, memory, model, classified.options_key)
            footprint = Footprint.fixed(known) if known is not None else None
        if footprint is None:
            assert link.session is not None
            footprint = await self.envelopes.envelope(
                consumer,
                memory,
                link.session,
                model,
                classified.options_key,
                cards_of(self.core, consumer),
            )
        if footprint is None:
            return None
        envelope = footprint.ceiling
        residency = settings.residency(model)
        return Demand(
            key=key,
            gpu=consumer.cards[0],
            envelope=envelope,
            priority=priority,
            resident_priority=model_class,
            policy=residency.policy,
            idle_ttl=classified.idle_ttl,
            reload_seconds=settings.reload_seconds(model, envelope),
            sets_ttl=classified.sets_ttl,
            scope=classified.scope,
            appear_within=classified.appear_within,
            replaces=(
                ResidentKey(consumer.name, classified.replaces) if classified.replaces else None
            ),
            # The runtime's memory is its process's: a PROCESS demand of a request switches
            # the running process's model, and its answer ends the lease.
            switch=classified.scope is LeaseScope.PROCESS and link.runtime.lifecycle is not None,
            most_models=link.runtime.residents.most_models,
            floor=footprint.floor if footprint.degrades else None,
            sizing=sizing_of(memory),
        )

    # -- what bounds a demand a runtime sizes from its request (`Bounds`) ----------------

    def measured_job(self, kind: ResidentKey) -> Measured | None:
        """The peak measured for jobs of this kind, if any."""
        return self.envelopes.measured_job(kind)
