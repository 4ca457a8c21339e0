"""Explicit leases over the control API: ask, renew, release, list, lapse, and misuse."""

from __future__ import annotations

import asyncio

import aiohttp
import attrs
import ollama
import pytest

from gpugate.core.effects import EventKind
from gpugate.core.units import GiB
from tests.control.conftest import admin


async def call(stack, method: str, path: str, body: object = None) -> tuple[int, dict, dict]:
    async with (
        aiohttp.ClientSession() as session,
        session.request(method, stack.control_url + path, json=body, headers=admin()) as resp,
    ):
        return resp.status, dict(resp.headers), await resp.json()


async def test_a_lease_is_granted_listed_renewed_and_released(stack):
    status, _, lease = await call(
        stack, "POST", "/gate/v1/leases", {"consumer": "ollama", "bytes": "4GiB", "ttl": "30s"}
    )
    assert status == 201, lease
    assert (lease["consumer"], lease["bytes"], lease["class"], lease["ttl"]) == (
        "ollama",
        4 * GiB,
        "interactive",
        30.0,
    )
    assert 29 < lease["expires_in"] <= 30
    assert stack.gate.core.budget(0).consumer("ollama").pending == 4 * GiB

    _, _, listed = await call(stack, "GET", "/gate/v1/leases")
    assert [x["id"] for x in listed["leases"]] == [lease["id"]]
    _, _, state = await call(stack, "GET", "/gate/v1/status")
    assert [(x["id"], x["pending"]) for x in state["leases"]] == [(lease["id"], 4 * GiB)]

    status, _, renewed = await call(stack, "POST", f"/gate/v1/leases/{lease['id']}/renew")
    assert status == 200 and renewed["expires_in"] > 29

    status, _, released = await call(stack, "DELETE", f"/gate/v1/leases/{lease['id']}")
    assert status == 200 and released["released"] is True
    assert stack.gate.core.leases() == [] and stack.gate.core.waiting() == []
    _, _, listed = await call(stack, "GET", "/gate/v1/leases")
    assert listed == {"leases": []}
    status, headers, body = await call(stack, "DELETE", f"/gate/v1/leases/{lease['id']}")
    assert status == 409 and headers["X-GPUGate-Failure"] == "LEASE_CONFLICT"
    assert body["error"]["class"] == "LEASE_CONFLICT"


async def test_a_lease_that_is_not_renewed_lapses_with_lease_timeout(stack):
    lapsed = stack.next_event(EventKind.LEASE_RELEASED, reason="expired")
    status, _, lease = await call(
        stack, "POST", "/gate/v1/leases", {"identity": "trainer", "bytes": "2GiB", "ttl": 1}
    )
    assert status == 201 and lease["identity"] == "trainer"
    assert stack.gate.core.budget(0).consumer("identity:trainer").pending == 2 * GiB
    await asyncio.wait_for(lapsed, 5)
    assert stack.gate.core.leases() == []
    failures = [e for e in stack.gate.recent_events() if e.kind is EventKind.FAILURE]
    assert [f.failure.failure_class.value for f in failures] == ["LEASE_TIMEOUT"]
    status, _, body = await call(stack, "POST", f"/gate/v1/leases/{lease['id']}/renew")
    assert status == 409 and body["error"]["class"] == "LEASE_CONFLICT"


async def test_a_lease_evicts_an_idle_lower_class_model(stack):
    # bge-m3 is background; the lease is interactive and needs its memory.
    await ollama.AsyncClient(host=stack.gate_url).embed(model="bge-m3", input="x")
    await ollama.AsyncClient(host=stack.gate_url).generate(
        model="gemma3:12b", prompt="x", options={"num_predict": 1}
    )
    assert {m["name"] for m in await stack.ps()} == {"bge-m3:latest", "gemma3:12b"}
    status, _, lease = await call(
        stack, "POST", "/gate/v1/leases", {"consumer": "ollama", "bytes": "5GiB", "max_wait": 20}
    )
    assert status == 201, lease
    assert {m["name"] for m in await stack.ps()} == {"gemma3:12b"}
    evicted = [e for e in stack.gate.recent_events() if e.kind is EventKind.EVICTION_DONE]
    assert [e.model for e in evicted] == ["bge-m3:latest"]
    await call(stack, "DELETE", f"/gate/v1/leases/{lease['id']}")
    assert stack.gate.core.leases() == []


async def test_a_lease_that_cannot_fit_fails_in_the_failure_class_shape(stack):
    status, _, first = await call(
        stack,
        "POST",
        "/gate/v1/leases",
        {"consumer": "ollama", "bytes": "12GiB", "class": "production"},
    )
    assert status == 201
    status, headers, body = await call(
        stack, "POST", "/gate/v1/leases", {"consumer": "ollama", "bytes": "4GiB", "max_wait": "1s"}
    )
    assert status == 503
    assert headers["X-GPUGate-Failure"] == body["error"]["class"]
    assert body["error"]["class"] in {"LEASE_TIMEOUT", "INSUFFICIENT_SCHEDULABLE_VRAM"}
    assert int(headers["Retry-After"]) >= 1
    assert [x.id for x in stack.gate.core.leases()] == [first["id"]]
    assert stack.gate.core.waiting() == []
    await call(stack, "DELETE", f"/gate/v1/leases/{first['id']}")


@pytest.mark.parametrize(
    ("body", "words"),
    [
        ({"consumer": "ollama", "bytes": 0}, "more than 0 bytes"),
        ({"consumer": "ollama", "bytes": -5}, "negative"),
        ({"consumer": "ollama", "bytes": "64GiB"}, "more than GPU 0 has"),
        ({"consumer": "comfy", "bytes": "1GiB"}, "no consumer 'comfy'"),
        ({"identity": "nobody", "bytes": "1GiB"}, "no identity 'nobody'"),
        ({"consumer": "ollama", "bytes": "1GiB", "class": "urgent"}, "unknown priority class"),
        ({"consumer": "ollama", "identity": "trainer", "bytes": "1GiB"}, "exactly one"),
        ({"consumer": "ollama", "bytes": "1GiB", "ttl": "0.5s"}, "at least 1s"),
        ({"consumer": "ollama", "bytes": "1GiB", "ttl": "soon"}, "ttl:"),
        ({"consumer": "ollama", "bytes": "1GiB", "colour": "red"}, "unknown field(s) colour"),
        ([1, 2], "JSON object"),
    ],
)
async def test_misuse_is_a_clear_400(stack, body, words):
    status, _, answer = await call(stack, "POST", "/gate/v1/leases", body)
    assert status == 400, answer
    assert words in answer["error"]["message"]
    assert stack.gate.core.leases() == [] and stack.gate.core.waiting() == []


async def test_renewing_or_releasing_an_unknown_lease_is_a_conflict(stack):
    for method, path in (("POST", "/gate/v1/leases/42/renew"), ("DELETE", "/gate/v1/leases/x")):
        status, headers, body = await call(stack, method, path)
        assert status == 409 and headers["X-GPUGate-Failure"] == "LEASE_CONFLICT"
        assert "LEASE_CONFLICT" in body["error"]["message"]


async def test_a_ttl_up_to_the_maximum_is_granted_and_a_longer_one_refused(stack):
    assert stack.gate.config.gate.max_lease_ttl == 3600.0  # the default
    status, _, answer = await call(
        stack, "POST", "/gate/v1/leases", {"consumer": "ollama", "bytes": "1GiB", "ttl": "1h1s"}
    )
    assert status == 400 and answer["error"]["class"] == "BAD_REQUEST"
    assert answer["error"]["message"] == (
        "ttl: at most 1h (gate.max_lease_ttl), got 1h1s: a holder that dies leaves its "
        "bytes leased for the ttl; ask for a shorter one and renew it"
    )
    assert stack.gate.core.leases() == [] and stack.gate.core.waiting() == []
    status, _, lease = await call(
        stack, "POST", "/gate/v1/leases", {"consumer": "ollama", "bytes": "1GiB", "ttl": "1h"}
    )
    assert status == 201 and lease["ttl"] == 3600.0
    await call(stack, "DELETE", f"/gate/v1/leases/{lease['id']}")
    assert stack.gate.core.leases() == []


async def test_a_lowered_maximum_cuts_a_held_lease_s_ttl_at_its_next_renewal(stack):
    status, _, lease = await call(
        stack, "POST", "/gate/v1/leases", {"consumer": "ollama", "bytes": "1GiB", "ttl": "30m"}
    )
    assert status == 201 and lease["ttl"] == 1800.0
    gate = stack.gate
    gate.config = attrs.evolve(gate.config, gate=attrs.evolve(gate.config.gate, max_lease_ttl=60.0))
    status, _, renewed = await call(stack, "POST", f"/gate/v1/leases/{lease['id']}/renew")
    assert status == 200 and renewed["ttl"] == 60.0 and renewed["expires_in"] <= 60.0
    await call(stack, "DELETE", f"/gate/v1/leases/{lease['id']}")
    assert stack.gate.core.leases() == []
