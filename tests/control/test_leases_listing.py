"""`GET /gate/v1/leases` lists every lease with its scope; explicit ones read as before."""

from __future__ import annotations

import aiohttp
import attrs

from gpugate.core.tickets import LeaseScope
from gpugate.core.units import GiB, MiB
from tests.control.conftest import admin
from tests.core.builders import demand

EXPLICIT_FIELDS = {
    "id",
    "consumer",
    "gpu",
    "bytes",
    "class",
    "ttl",
    "expires_in",
    "waited",
    "held_for",
    "scope",
}


async def get(stack, path: str) -> tuple[int, dict]:
    async with (
        aiohttp.ClientSession() as session,
        session.get(stack.control_url + path, headers=admin()) as resp,
    ):
        return resp.status, await resp.json()


async def test_a_hung_load_and_a_process_start_are_listed_beside_an_explicit_lease(stack):
    gate = stack.gate
    # A load that never finishes: its request's lease stays, with all its bytes pending.
    hung = await gate.leases.acquire(demand("llama3.2:3b", 512 * MiB))
    started = await gate.leases.acquire(
        attrs.evolve(demand("<process>", 1 * GiB), scope=LeaseScope.PROCESS, appear_within=60.0)
    )
    async with (
        aiohttp.ClientSession() as session,
        session.post(
            stack.control_url + "/gate/v1/leases",
            json={"consumer": "ollama", "bytes": "1GiB", "ttl": 30},
            headers=admin(),
        ) as resp,
    ):
        assert resp.status == 201
        explicit = await resp.json()
    assert explicit["scope"] == "explicit"
    try:
        status, listed = await get(stack, "/gate/v1/leases")
        assert status == 200
        by_id = {x["id"]: x for x in listed["leases"]}
        assert sorted(by_id) == [x["id"] for x in listed["leases"]]
        assert set(by_id) == {hung.id, started.id, explicit["id"]}

        request = by_id[hung.id]
        assert (request["scope"], request["model"], request["bytes"]) == (
            "request",
            "llama3.2:3b",
            512 * MiB,
        )
        assert request["pending"] == hung.pending
        assert (request["ttl"], request["expires_in"]) == (None, None)
        assert by_id[started.id]["scope"] == "process"
        # What an explicit-lease client reads is unchanged: the same fields, the same values.
        assert set(by_id[explicit["id"]]) == EXPLICIT_FIELDS
        assert by_id[explicit["id"]]["bytes"] == 1 * GiB
        assert 29 < by_id[explicit["id"]]["expires_in"] <= 30

        status, only = await get(stack, "/gate/v1/leases?scope=explicit")
        assert status == 200
        assert [x["id"] for x in only["leases"]] == [explicit["id"]]
        status, flowing = await get(stack, "/gate/v1/leases?scope=request,process")
        assert [x["id"] for x in flowing["leases"]] == sorted([hung.id, started.id])
        status, body = await get(stack, "/gate/v1/leases?scope=forever")
        assert status == 400 and body["error"]["class"] == "BAD_REQUEST"
    finally:
        gate.leases.release(hung)
        gate.leases.release(started, failed=True)
        for lease in gate.leases.explicit_leases():
            gate.leases.release(lease)
    assert (await get(stack, "/gate/v1/leases"))[1] == {"leases": []}


def test_the_cli_view_shows_each_lease_scope_and_only_explicit_ones_expire():
    from gpugate.commands.views import leases_rows

    status = {
        "leases": [
            {"id": 1, "consumer": "ollama", "model": "m", "pending": 5, "waited_seconds": 0.0},
            {"id": 2, "consumer": "ollama", "model": "", "pending": 0, "waited_seconds": 0.0},
            {"id": 3, "consumer": "ollama", "model": "m", "pending": 0, "waited_seconds": 0.0},
        ]
    }
    listed = {
        "leases": [
            {"id": 1, "scope": "request", "bytes": 5, "expires_in": None},
            {"id": 2, "scope": "explicit", "bytes": 7, "expires_in": 12.0},
        ]
    }
    rows = {r["id"]: r for r in leases_rows(status, listed)}
    assert [(rows[i]["scope"], rows[i]["explicit"], rows[i]["expires_in"]) for i in (1, 2, 3)] == [
        ("request", False, None),
        ("explicit", True, 12.0),
        ("-", False, None),
    ]
    # A gate that lists explicit leases without a scope: what it lists is explicit.
    (old,) = leases_rows(status | {"leases": status["leases"][1:2]}, {"leases": [{"id": 2}]})
    assert (old["scope"], old["explicit"]) == ("explicit", True)
