"""A lease asked for at once only (`GateCore.submit(..., at_once=True)`): granted from the
memory no waiting ticket keeps back, evicting nobody, or deferred with nothing queued,
evicted or recorded."""

from __future__ import annotations

import attrs

from gpugate.core.classes import PriorityClass
from gpugate.core.effects import Grant
from gpugate.core.job_leases import JOBS_MODEL
from gpugate.core.tickets import Demand, LeaseScope
from gpugate.core.units import GiB
from tests.core.builders import Card, demand

P = PriorityClass


def job(nbytes: int) -> Demand:
    return attrs.evolve(demand("workflow", nbytes, consumer="comfy"), scope=LeaseScope.JOB)


def test_a_lease_asked_for_at_once_is_granted_from_free_memory_or_deferred():
    card = Card(("d", 7 * GiB, P.BACKGROUND), ("c", 5 * GiB, P.PRODUCTION))
    small = job(2 * GiB)
    granted = card.core.submit(small, card.now, at_once=True)
    assert granted.lease is not None and not granted.deferred
    assert [e for e in granted.effects if isinstance(e, Grant)] == []  # the lease is the answer
    assert [x.key.model for x in card.core.leases()].count(JOBS_MODEL) == 1
    # It would have to evict: deferred, with nothing queued, evicted or recorded.
    big = job(5 * GiB)
    deferred = card.core.submit(big, card.now, at_once=True)
    assert deferred.deferred and not deferred.waiting
    assert deferred.lease is None and deferred.failure is None
    assert deferred.effects == ()
    assert card.core.waiting() == []
    assert {r.key.model for r in card.core.residents(0)} >= {"c", "d"}


def test_a_lease_asked_for_at_once_never_goes_ahead_of_a_waiting_ticket():
    # 1.6 GiB schedulable; d serves a request. x waits for d and keeps 1 GiB meanwhile.
    card = Card(("c", 11 * GiB, P.PRODUCTION), ("d", 2 * GiB, P.BACKGROUND))
    assert card.core.submit(demand("d", 2 * GiB, priority=P.BACKGROUND), card.now).lease
    waiting = card.core.submit(demand("x", 3 * GiB, priority=P.INTERACTIVE), card.now)
    assert waiting.waiting
    # A production request asked for at once is deferred; asked for as usual, it would
    # go ahead of x and have the 1.6 GiB.
    ahead = demand("a", 1 * GiB, priority=P.PRODUCTION)
    assert card.core.submit(ahead, card.now, at_once=True).deferred
    assert [t.id for t in card.core.waiting(0)] == [waiting.ticket_id]
    assert card.core.submit(ahead, card.now).lease is not None
