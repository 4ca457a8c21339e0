"""Explicit leases: VRAM asked for by work that is not a request (a batch job, a training run).

Such a lease queues like any demand (same planner, same classes, it may evict idle
lower-class residents) but loads no model: once granted, its bytes stay `pending` for its
owner until it is released or lapses. It lapses when it is not renewed within its ttl.
"""

from __future__ import annotations

import attrs

from gpugate.core.books import Books
from gpugate.core.classes import PriorityClass, ResidencyPolicy
from gpugate.core.effects import Event, EventKind
from gpugate.core.failures import Failure, FailureClass
from gpugate.core.residents import ResidentKey
from gpugate.core.tickets import Demand, Lease

IDENTITY_PREFIX = "identity:"
"""Budget row of a lease held by a named identity rather than a consumer."""


def identity_owner(name: str) -> str:
    """The budget row an identity's explicit leases are counted under."""
    return IDENTITY_PREFIX + name


@attrs.frozen
class LeaseTerms:
    """What an explicit lease asks for."""

    owner: str
    """A consumer's name, or `identity_owner(name)`."""
    gpu: int
    bytes: int
    priority: PriorityClass
    ttl: float
    """Seconds it stays granted without a renewal."""
    max_wait: float | None = None
    """Seconds it may wait to be granted; None: its class's `max_wait`."""


def lease_model(lease_id: int) -> str:
    """The name an explicit lease goes by where a model's name would be (`lease-7`)."""
    return f"lease-{lease_id}"


def explicit_demand(terms: LeaseTerms, lease_id: int) -> Demand:
    """The demand for an explicit lease; its key is unique, so it never rides on another."""
    return Demand(
        key=ResidentKey(terms.owner, lease_model(lease_id)),
        gpu=terms.gpu,
        envelope=terms.bytes,
        priority=terms.priority,
        resident_priority=terms.priority,
        policy=ResidencyPolicy.LOAD_ON_DEMAND,
        idle_ttl=0.0,
        sets_ttl=False,
        max_wait=terms.max_wait,
        lease_ttl=terms.ttl,
    )


def due(books: Books, now: float) -> list[Lease]:
    """Explicit leases whose expiry has come, oldest id first."""
    return sorted(
        (x for x in books.leases.values() if x.expires_at is not None and x.expires_at <= now),
        key=lambda x: x.id,
    )


def next_expiry(books: Books) -> float | None:
    times = [x.expires_at for x in books.leases.values() if x.expires_at is not None]
    return min(times) if times else None


def lapse_events(lease: Lease, now: float) -> list[Event]:
    """A LEASE_TIMEOUT failure and the release, for a lease that was not renewed in time."""
    ttl = lease.demand.lease_ttl or 0.0
    failure = Failure(
        FailureClass.LEASE_TIMEOUT,
        f"LEASE_TIMEOUT: lease {lease.id} of {lease.key.consumer} "
        f"({lease.demand.envelope} bytes on GPU {lease.gpu}) was not renewed within its "
        f"ttl of {ttl:g}s; its bytes are returned",
        consumer=lease.key.consumer,
        model=lease.key.model,
        gpu=lease.gpu,
        bytes_needed=lease.demand.envelope,
    )
    return [
        Event(
            EventKind.FAILURE,
            now,
            key=lease.key,
            gpu=lease.gpu,
            bytes=lease.demand.envelope,
            failure=failure,
            detail=failure.message,
        ),
        Event(
            EventKind.LEASE_RELEASED,
            now,
            key=lease.key,
            gpu=lease.gpu,
            wait=lease.waited,
            reason="expired",
            lease=lease.id,
        ),
    ]
