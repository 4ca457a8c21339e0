"""A short slice of the three-host rehearsal (tests/scaleout/fleet.py; the whole one runs
in `make demo`): the same seeded trace straight at three simulated hosts behind a plain
load balancer, then through their gates behind HAProxy routing by capacity, one gate
killed a third of the way through and started again at two thirds."""

from __future__ import annotations

import pytest

from tests.scaleout import fleet, netns

SEED = 20261207
REQUESTS = 90


@pytest.fixture
def namespaces_allowed() -> None:
    """Skips, saying why, where network namespaces cannot be made (not root, no iproute2)."""
    reason = netns.unavailable()
    if reason is not None:
        pytest.skip(reason)


@pytest.mark.usefixtures("namespaces_allowed")
async def test_three_hosts_direct_then_gated_with_one_gate_killed():
    ops = fleet.trace_ops(REQUESTS, SEED)
    assert ops == fleet.trace_ops(REQUESTS, SEED), "seeded: the same trace every time"
    direct = await fleet.replay(ops, gated=False, seed=SEED)
    gated = await fleet.replay(ops, gated=True, seed=SEED)
    print(fleet.table(REQUESTS, SEED, direct, gated))

    # Straight at the runtimes, the batch jobs and the loads run into each other.
    assert sum(direct.ooms.values()) > 0
    # Through the gates: no OOM, every request answered by the runtime or refused by a gate
    # with its class, nothing left leased.
    assert not gated.ooms, gated.ooms
    assert gated.outcomes["lost"] == 0, [a for a in gated.answers if a.outcome == "lost"]
    assert gated.outcomes["runtime error"] == 0
    assert gated.outcomes["answered"] > 0
    assert all(a.failure for a in gated.answers if a.outcome == "refused")
    assert gated.leases_left == 0
    assert len(gated.answers) == len(direct.answers) == sum(k == "ollama" for k, _ in ops)

    # The gate was killed and started again, and its host served again once it was back.
    down = fleet.HOSTS[fleet.victim(SEED)]
    kill_at, restart_at = REQUESTS // 3, 2 * REQUESTS // 3
    assert gated.events == [
        f"gate {down} killed at operation {kill_at}",
        f"gate {down} started at operation {restart_at}",
    ]
    assert any(a.served_by == down and a.op > restart_at for a in gated.answers)

    # Routing by capacity sends a request where its model is: more requests find it loaded,
    # and the fleet loads fewer models than round robin does.
    share = gated.resident / gated.outcomes["answered"]
    assert share > direct.resident / direct.outcomes["answered"]
    assert gated.loads < direct.loads
