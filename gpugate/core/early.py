"""Jobs their runtime runs before their lease (`Demand.started`).

A runtime that alone can judge a job (a custom node's own validation) is sent it with no
lease, and the job is leased once the runtime has accepted it. By then the runtime may be
running it: from the runtime's acceptance to the grant, the job may take any of the free
memory, and a sample may already show some of it as its consumer's memory beyond the books
(`unexplained`). Three rules keep that memory the job's and nobody else's:

* **First in the queue.** Its ticket goes ahead of every other on its GPU, whatever their
  class (`Ticket.order`): no later demand is planned on the free memory before it.
* **No backfill.** While it waits, its ticket keeps back all it still needs, not only what
  its evictions will not cover (`kept_back`): the free memory the job may be taking now is
  not lent to a later ticket until the evicted bytes are back.
* **Its own bytes are its own.** What its consumer's samples show beyond the books since the
  job went up (beyond `Started.before`) is the job's early allocations: it counts toward the
  job's need, not against it (`credit`), so the job is planned as it would have been had it
  not started, and its grant takes those bytes off the consumer's unexplained memory rather
  than counting them twice. One pass credits those bytes once, to the first such job of the
  consumer.

A job whose lease cannot be had (or whose client left) is withdrawn: its runtime is asked
to drop it, and once the job has stopped, what it left on the card becomes its consumer's
`<held>` resident, given back at once (`GateCore.withdrawn`). Until then it may still be
running: every pass keeps back what it may still take (`withheld`), as its ticket did.

Until a started job is granted or withdrawn, the memory it took is settling: pressure relief
does not evict anyone for it (`settling`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import attrs

from gpugate.core.planner import Plan
from gpugate.core.tickets import Demand, LeaseScope, Ticket


def credit(demand: Demand, unexplained: Mapping[str, int], credited: Mapping[str, int]) -> int:
    """Bytes of `demand`'s need its runtime already holds for it (0 for a demand that has not
    started): its consumer's unexplained memory on its GPU beyond what it was before the job
    went up, less what earlier tickets of this pass were credited, at most its need."""
    started = demand.started
    if started is None or demand.scope is not LeaseScope.JOB:
        return 0
    consumer = demand.consumer
    early = unexplained.get(consumer, 0) - started.before(demand.gpu)
    return max(0, min(demand.envelope, early - credited.get(consumer, 0)))


def planned(demand: Demand, early: int) -> Demand:
    """The demand as the planner sees it: what it still needs beyond its early bytes."""
    return demand if not early else attrs.evolve(demand, envelope=demand.envelope - early)


def kept_back(demand: Demand, decision: Plan) -> int:
    """What a waiting ticket keeps back from the tickets behind it: the part of its need
    what it waits for will not cover; all of it for a job that may be running."""
    if demand.started is not None:
        return max(0, decision.needed)
    return max(0, decision.needed - decision.eventual)


def withheld(
    gpu: int, unexplained: Mapping[str, int], withdrawing: Mapping[tuple[str, int], list[Demand]]
) -> int:
    """What jobs being withdrawn from a GPU may still take there: per consumer, their needs
    beyond what the samples already show of them (which the budget counts)."""
    total = 0
    for (consumer, card), demands in withdrawing.items():
        if card != gpu or not demands:
            continue
        before = min(d.started.before(gpu) for d in demands if d.started is not None)
        seen = max(0, unexplained.get(consumer, 0) - before)
        total += max(0, sum(d.envelope for d in demands) - seen)
    return total


def settling(
    gpu: int,
    waiting: Iterable[Ticket],
    unexplained: Mapping[str, int],
    withdrawing: Mapping[tuple[str, int], list[Demand]],
) -> int:
    """Bytes of a GPU's consumers' unexplained memory that started jobs took and that their
    grant or withdrawal settles: all of a consumer's whose job is being withdrawn, and the
    early bytes of those whose job still waits for its lease."""
    dropping = {consumer for consumer, card in withdrawing if card == gpu}
    total = sum(unexplained.get(consumer, 0) for consumer in dropping)
    early: dict[str, int] = {}
    for ticket in waiting:
        demand = ticket.demand
        consumer = demand.consumer
        if demand.started is None or demand.gpu != gpu or consumer in dropping:
            continue
        # A consumer's started jobs share its early bytes (its runtime runs one at a time).
        early[consumer] = max(early.get(consumer, 0), credit(demand, unexplained, {}))
    return total + sum(early.values())
