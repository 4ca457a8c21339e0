"""Jobs their runtime runs before their lease (`gpugate.core.early`), rule by rule."""

from __future__ import annotations

import attrs

from gpugate.core.classes import PriorityClass
from gpugate.core.effects import EventKind, Grant, UnloadReason
from gpugate.core.scopes import HELD_MODEL
from gpugate.core.tickets import Demand, LeaseScope, Started
from gpugate.core.units import GiB, MiB
from tests.core.builders import Card, demand, unloads

P = PriorityClass
C = "comfy"


def job(nbytes: int, *, before: int = 0, klass: P = P.INTERACTIVE) -> Demand:
    """A job its runtime accepted (and started) before its lease; `before`: what the
    consumer held beyond the books when it went up."""
    return attrs.evolve(
        demand("workflow", nbytes, consumer=C, priority=klass),
        scope=LeaseScope.JOB,
        started=Started(((0, before),)),
    )


def test_a_started_job_waiting_for_an_eviction_lends_nobody_the_free_memory():
    # 2.6 GiB schedulable; the job needs 3 GiB and evicts the idle 7 GiB model for it.
    card = Card(("d", 7 * GiB, P.BACKGROUND), ("c", 5 * GiB, P.PRODUCTION))
    free = card.schedulable
    assert 2 * GiB < free < 3 * GiB
    admission = card.core.submit(job(3 * GiB), card.now)
    assert admission.waiting
    assert [u.key.model for u in unloads(admission.effects)] == ["d"]
    # The job may be taking the free 2.6 GiB already: a 2 GiB request waits for the rest.
    request = card.core.submit(demand("a", 2 * GiB), card.now)
    assert request.waiting
    assert card.schedulable == free
    # A demand that has not started lends it: the same request behind an ordinary job is
    # granted from the free memory its evictions will make up for.
    other = Card(("d", 7 * GiB, P.BACKGROUND), ("c", 5 * GiB, P.PRODUCTION))
    ordinary = attrs.evolve(job(3 * GiB), started=None)
    assert other.core.submit(ordinary, other.now).waiting
    assert other.core.submit(demand("a", 2 * GiB), other.now).lease is not None


def test_a_started_job_goes_ahead_of_a_higher_class():
    card = Card(("d", 7 * GiB, P.BACKGROUND), ("c", 5 * GiB, P.PRODUCTION))
    started = card.core.submit(job(3 * GiB), card.now)
    assert started.waiting
    production = card.core.submit(demand("a", 2 * GiB, priority=P.PRODUCTION), card.now)
    assert production.waiting
    assert [t.id for t in card.core.waiting(0)] == [started.ticket_id, production.ticket_id]
    # Once the eviction is done the job is granted first, then the production request.
    [unload] = unloads(started.effects)
    effects = card.unloaded(unload)
    granted = [e.ticket_id for e in effects if isinstance(e, Grant)]
    assert granted == [started.ticket_id, production.ticket_id]


def test_a_started_jobs_sampled_bytes_count_toward_it_not_against_it():
    # 1.4 GiB schedulable; the job needs 2.2 GiB: the idle background model must go.
    card = Card(("d", 2 * GiB, P.BACKGROUND), ("c", 11 * GiB, P.PRODUCTION))
    card.external = 1200 * MiB
    card.sample()
    free = card.schedulable
    admission = card.core.submit(job(2250 * MiB), card.now)
    assert admission.waiting
    [unload] = unloads(admission.effects)
    # The runtime runs the job meanwhile, taking what the card has free (the reserve
    # too), and a sample shows it.
    card.comfy = 1400 * MiB
    card.sample()
    assert card.schedulable == free - 1400 * MiB
    effects = card.unloaded(unload)
    [grant] = [e for e in effects if isinstance(e, Grant)]
    assert grant.ticket_id == admission.ticket_id
    # Counted once: its lease now explains what the sample showed of it.
    row = card.core.budget(0).consumer(C)
    assert row.unexplained == 0 and row.committed == 2250 * MiB
    assert card.schedulable == free + 2 * GiB - 2250 * MiB
    # Planned as it would have been had it not started: it did not evict the production
    # model it could never evict, nor fail.
    assert "c" in card.loaded


def test_what_the_consumer_held_before_the_job_went_up_is_not_the_jobs():
    card = Card(("c", 11 * GiB, P.PRODUCTION))
    card.comfy = 3 * GiB  # held beyond the books (a prompt sent to the runtime directly)
    card.sample()
    free = card.schedulable
    assert free < 2 * GiB
    admission = card.core.submit(job(2 * GiB, before=3 * GiB), card.now)
    assert admission.lease is None
    assert card.schedulable == free


def test_a_withdrawn_jobs_leftovers_are_held_and_given_back_at_once():
    card = Card(("c", 11 * GiB, P.PRODUCTION))
    wanted = job(4 * GiB)
    admission = card.core.submit(wanted, card.now)
    assert admission.failure is not None  # nothing it may evict: it can never fit
    [marked] = card.core.scheduler.withdrawing[(C, 0)]
    assert marked.started is wanted.started
    card.comfy = 2 * GiB  # what it loaded before it was stopped
    card.sample()
    effects = card.core.job_events.withdrawn(wanted, card.now)
    [unload] = unloads(effects)
    assert unload.key.model == HELD_MODEL and unload.reason is UnloadReason.WITHDRAWN
    assert unload.bytes == 2 * GiB
    assert card.core.scheduler.withdrawing == {}
    assert [r.key.model for r in card.core.residents(0) if r.key.consumer == C] == [HELD_MODEL]


def test_what_a_failed_job_may_still_take_is_kept_back_until_it_is_withdrawn():
    card = Card(("c", 11 * GiB, P.PRODUCTION))
    wanted = job(4 * GiB)
    assert card.core.submit(wanted, card.now).failure is not None
    # Its runtime is being asked to drop it; until then it may hold up to 4 GiB of the
    # 3.6 GiB schedulable, unsampled: a request waits.
    request = card.core.submit(demand("a", 2 * GiB), card.now)
    assert request.waiting
    # Dropped: a sample shows it left nothing, and the request is granted.
    card.sample()
    effects = card.core.job_events.withdrawn(wanted, card.now)
    assert [e.ticket_id for e in effects if isinstance(e, Grant)] == [request.ticket_id]


def test_a_job_failing_in_a_pass_keeps_its_memory_from_the_tickets_behind_it():
    # 1.6 GiB schedulable; d (2 GiB, the job's class) serves a request: the job waits for it.
    card = Card(("c", 11 * GiB, P.PRODUCTION), ("d", 2 * GiB, P.INTERACTIVE))
    assert card.core.submit(demand("d", 2 * GiB), card.now).lease is not None
    assert card.core.submit(job(3 * GiB), card.now).waiting
    behind = card.core.submit(demand("a", 512 * MiB, priority=P.MAINTENANCE), card.now)
    assert behind.waiting
    # An external process grows: the job can never fit now and fails in this sample's pass,
    # but it runs until its runtime drops it; the request behind it still waits.
    card.external = 800 * MiB
    effects = card.sample()
    assert [e.kind for e in effects if getattr(e, "kind", None) is EventKind.FAILURE]
    assert [e for e in effects if isinstance(e, Grant)] == []
    assert [t.id for t in card.core.waiting(0)] == [behind.ticket_id]


def test_a_withdrawn_job_that_left_nothing_beyond_what_was_there_evicts_nothing():
    card = Card(("c", 11 * GiB, P.PRODUCTION))
    card.comfy = 300 * MiB  # the runtime's context, held before the job
    card.sample()
    wanted = job(4 * GiB, before=300 * MiB)
    assert card.core.submit(wanted, card.now).failure is not None
    assert card.core.job_events.withdrawn(wanted, card.now) == []
    assert card.core.scheduler.withdrawing == {}
    assert card.core.residents(0)[0].key.model == "c"


def test_pressure_from_a_waiting_started_jobs_early_bytes_evicts_nobody():
    # The job runs into the reserve while it waits for a busy model's memory.
    card = Card(("c", 11 * GiB, P.PRODUCTION), ("d", 2 * GiB, P.BACKGROUND))
    busy = card.core.submit(demand("d", 2 * GiB, priority=P.BACKGROUND), card.now)
    assert busy.lease is not None  # d is serving a request: not evictable now
    admission = card.core.submit(job(2500 * MiB), card.now)
    assert admission.waiting and unloads(admission.effects) == []
    card.comfy = 2500 * MiB
    effects = card.sample()
    assert card.schedulable < 0
    assert [e.kind for e in effects if getattr(e, "kind", None) is EventKind.PRESSURE_ENTERED]
    assert unloads(effects) == []
    assert {r.key.model for r in card.core.residents(0)} == {"c", "d"}
