"""Hostile requests on the control API: each gets its answer in the API's error shape (a
400 for what cannot be read), no traceback, and the books as they were."""

from __future__ import annotations

import gzip
import json
import logging

import aiohttp
import attrs
import pytest

from gpugate.control.bodies import MAX_BODY
from gpugate.runtimes.sections import load_config_text
from tests.control.conftest import admin

LEASES = "/gate/v1/leases"
DEEP = 50_000


def lease(**fields: object) -> bytes:
    return json.dumps({"consumer": "ollama", "bytes": "1GiB", **fields}).encode()


async def send(
    stack, method: str, path: str, data: bytes = b"", headers: dict[str, str] | None = None
) -> tuple[int, dict[str, str], dict]:
    """`data` as the body, as it is; the answer's status, headers and JSON document."""
    async with (
        aiohttp.ClientSession() as session,
        session.request(
            method,
            stack.control_url + path,
            data=data,
            headers={**admin(), **(headers or {})},
            skip_auto_headers=("Content-Type",),
        ) as resp,
    ):
        if resp.status >= 400 or resp.content_type == "application/json":
            # Every answer this API writes itself, and each of its refusals, is JSON.
            assert resp.content_type == "application/json", await resp.text()
            return resp.status, dict(resp.headers), await resp.json()
        return resp.status, dict(resp.headers), {"text": await resp.text()}


@pytest.fixture
def no_traceback(caplog):
    """Fails the test when anything logged a traceback (aiohttp's 'Error handling request')."""
    caplog.set_level(logging.DEBUG)
    yield
    assert [r.getMessage() for r in caplog.records if r.exc_info] == []


BAD_BODIES = [
    pytest.param(b'{"consumer":' + b"[" * DEEP, "nested deeper", id="nested-50000-deep"),
    pytest.param(b'{"consumer": "ollama", "bytes": ' + b"[" * 20_000 + b"]" * 20_000 + b"}",
                 "nested deeper", id="nested-closed"),
    pytest.param(lease(bytes="9" * 400), "more bytes than any card", id="bytes-400-digits"),
    pytest.param(lease(bytes="9" * 400 + "GiB"), "more bytes than any card", id="bytes-GiB"),
    pytest.param(b'{"consumer": "ollama", "bytes": ' + b"9" * 400 + b"}", "more than GPU 0 has",
                 id="bytes-400-digit-integer"),
    pytest.param(b'{"consumer": "ollama", "bytes": ' + b"9" * 5000 + b"}", "not JSON this API",
                 id="bytes-5000-digit-integer"),
    pytest.param(b'{"consumer": "ollama", "bytes": 1e400}', "past a double", id="bytes-1e400"),
    pytest.param(b'{"consumer": "ollama", "bytes": NaN}', "NaN is not a JSON number",
                 id="bytes-NaN"),
    pytest.param(b'{"consumer": "ollama", "bytes": "1GiB", "ttl": Infinity}',
                 "Infinity is not a JSON number", id="ttl-Infinity"),
    pytest.param(b'{"consumer": "ollama", "bytes": "1GiB", "ttl": -Infinity}',
                 "-Infinity is not a JSON number", id="ttl-minus-Infinity"),
    pytest.param(b'{"consumer": "ollama", "bytes": "1GiB", "ttl": ' + b"9" * 400 + b"}",
                 "longer than 1000 years", id="ttl-400-digit-integer"),
    pytest.param(lease(ttl="9" * 400), "longer than 1000 years", id="ttl-400-digits"),
    pytest.param(lease(ttl="99999999999999d"), "longer than 1000 years", id="ttl-8.64e18s"),
    pytest.param(lease(ttl="2h"), "at most 1h (gate.max_lease_ttl)", id="ttl-past-the-max"),
    pytest.param(lease(max_wait="9" * 400 + "h"), "longer than 1000 years", id="max-wait-huge"),
    pytest.param(lease(ttl=[30]), "ttl: expected seconds", id="ttl-a-list"),
    pytest.param(lease(bytes={"GiB": 1}), "bytes: expected", id="bytes-an-object"),
    pytest.param(lease(bytes=[1]), "bytes: expected", id="bytes-a-list"),
    pytest.param(lease(bytes=1.5), "bytes: expected", id="bytes-a-fraction"),
    pytest.param(lease(purpose=["start"]), "purpose:", id="purpose-a-list"),
    pytest.param(lease(gpu="0"), "gpu:", id="gpu-a-string"),
    pytest.param(lease(gpu=10**30), "gpu:", id="gpu-huge"),
    pytest.param(json.dumps({"identity": "trainer", "bytes": "1GiB", "gpu": 7}).encode(),
                 "gpu: no GPU 7", id="identity-on-a-gpu-the-gate-lacks"),
    pytest.param(json.dumps({"identity": "trainer", "bytes": "1GiB", "gpu": -1}).encode(),
                 "gpu: no GPU -1", id="identity-on-gpu-minus-1"),
    pytest.param(lease(**{"class": 10**30}), "class:", id="class-a-huge-number"),
    pytest.param(lease(consumer=None), "exactly one", id="consumer-null"),
    pytest.param(b'{"consumer": "ollama", "bytes": "1GiB", "bytes": "64GiB"}',
                 "'bytes' is given twice", id="duplicate-key"),
    pytest.param(b'{"consumer": "ollama", "bytes": "1GiB", "purpose": "hold", "purpose": '
                 b'"start"}', "'purpose' is given twice", id="duplicate-purpose"),
    pytest.param(b"\xff\xfe{\x00}\x00", "not UTF-8", id="utf-16"),
    pytest.param(b'{"consumer": "oll\xe9ama", "bytes": "1GiB"}', "not UTF-8", id="latin-1"),
    pytest.param(b'\xef\xbb\xbf{"consumer": "ollama", "bytes": "1GiB"}', "not JSON",
                 id="byte-order-mark"),
    pytest.param(b'{"consumer": "\\ud800", "bytes": "1GiB"}', "no consumer", id="lone-surrogate"),
    pytest.param(b"", "not JSON", id="empty"),
    pytest.param(b"{}{}", "not JSON", id="two-objects"),
    pytest.param(b'{"consumer": "ollama", "bytes": "1GiB"', "not JSON", id="cut-short"),
    pytest.param(b"null", "expected a JSON object", id="null"),
]  # fmt: skip


@pytest.mark.parametrize(("data", "words"), BAD_BODIES)
async def test_a_lease_request_that_cannot_be_read_is_a_400(stack, no_traceback, data, words):
    status, _, answer = await send(
        stack, "POST", LEASES, data, {"Content-Type": "application/json"}
    )
    assert status == 400, answer
    assert answer["error"]["class"] == "BAD_REQUEST"
    assert words in answer["error"]["message"]
    assert stack.gate.core.leases() == [] and stack.gate.core.waiting() == []


async def test_a_lease_token_s_hostile_body_is_a_400_too(stack, tmp_path, no_traceback):
    # The scope check reads the body before the handler does: for a `lease` token, a body
    # that cannot be read is the handler's 400, not a 403 nor a crash in the check.
    text = "gate:\n  control_tokens:\n    - {token: lease-only, scopes: [lease]}\n"
    tokens = load_config_text(text, tmp_path / "tokens.yaml").gate.control_tokens
    gate = stack.gate
    gate.config = attrs.evolve(
        gate.config, gate=attrs.evolve(gate.config.gate, control_tokens=tokens)
    )
    for data in (b'{"consumer":' + b"[" * DEEP, lease(bytes="9" * 400 + "GiB")):
        status, _, answer = await send(
            stack, "POST", LEASES, data, {"Authorization": "Bearer lease-only"}
        )
        assert status == 400 and answer["error"]["class"] == "BAD_REQUEST", answer
    assert stack.gate.core.leases() == [] and stack.gate.core.waiting() == []


async def test_a_body_past_the_limit_is_a_413_in_the_api_shape(stack, no_traceback):
    data = lease(consumer="ollama" + " " * MAX_BODY)
    status, _, answer = await send(stack, "POST", LEASES, data)
    assert status == 413, answer
    assert answer["error"]["class"] == "PAYLOAD_TOO_LARGE"
    assert str(MAX_BODY) in answer["error"]["message"]
    assert stack.gate.core.leases() == []


async def test_a_body_of_any_content_type_is_read_as_json(stack, no_traceback):
    # curl -d sends application/x-www-form-urlencoded; the body is JSON all the same.
    for kind in ("application/x-www-form-urlencoded", "text/plain; charset=latin-1", None):
        status, _, answer = await send(
            stack, "POST", LEASES, lease(), {"Content-Type": kind} if kind else None
        )
        assert status == 201, answer
        status, _, _ = await send(stack, "DELETE", f"{LEASES}/{answer['id']}")
        assert status == 200
    assert stack.gate.core.leases() == []


async def test_a_compressed_body_is_read_as_sent_and_refused(stack, no_traceback):
    # The control listener decodes no Content-Encoding (gpugate.proxy.runners): a gzip
    # body, whole or broken, is bytes that are not JSON.
    for data in (gzip.compress(lease()), b"\x1f\x8b not gzip at all"):
        status, _, answer = await send(stack, "POST", LEASES, data, {"Content-Encoding": "gzip"})
        assert status == 400, answer
        assert answer["error"]["class"] == "BAD_REQUEST"
    assert stack.gate.core.leases() == []


HOSTILE_ROUTES = [
    ("POST", f"{LEASES}/{'9' * 5000}/renew", 409),
    ("POST", f"{LEASES}/\u00b2/renew", 409),
    ("DELETE", f"{LEASES}/-1", 409),
    ("DELETE", f"{LEASES}/1e3", 409),
    ("GET", f"{LEASES}?scope=" + "x" * 3000, 400),
    ("GET", f"{LEASES}?scope=%ff", 400),
    ("POST", f"/gate/v1/gpus/{'9' * 40}/pause", 404),
    ("POST", "/gate/v1/gpus/\u00b2/resume", 400),
    ("POST", "/gate/v1/gpus/0x0/pause", 400),
    ("POST", "/gate/v1/consumers/%00/drain", 404),
    ("POST", "/gate/v1/consumers/" + "a" * 3000 + "/undrain", 404),
    ("GET", "/gate/v1/consumers/%ff", 404),
    ("POST", "/gate/v1/residents/ollama/%00/evict", 404),
    ("POST", "/gate/v1/residents/ollama/" + "a" * 3000 + "/evict", 404),
    ("POST", "/gate/v1/residents/ollama/:/evict", 404),
    ("POST", "/gate/v1/residents/ollama/x@sha256:zz/evict?force=%ff&options=%00", 404),
    ("POST", "/gate/v1/residents/nobody/x/evict", 404),
    ("GET", "/gate/v1/events?recent=\u00b2", 400),
    ("GET", "/gate/v1/events?recent=" + "9" * 5000, 200),
    ("GET", "/gate/v1/events?recent=-1&class=interactive", 400),
    ("GET", "/gate/v1/events?class=%ff", 400),
    ("GET", "/gate/v1/events?failure=" + "X" * 3000, 400),
    ("GET", "/gate/v1/events?follow=1&recent=\u00b2", 400),
    ("GET", "/gate/v1/stream?class=nope", 400),
    ("GET", "/gate/v1/history?step=" + "9" * 400, 400),
    ("GET", "/gate/v1/history?step=1e400", 400),
    ("GET", "/gate/v1/history?step=nan", 400),
    ("GET", "/gate/v1/history?step=0", 400),
    ("GET", "/gate/v1/history?gpu=" + "9" * 30, 400),
    ("GET", "/gate/v1/history?gpu=\u00b2", 400),
    ("GET", "/gate/v1/history?since=" + "9" * 400, 400),
    ("GET", "/gate/v1/history?since=nan", 400),
    ("GET", "/gate/v1/history?since=-inf", 400),
    ("GET", "/gate/v1/capacity?class=%ff", 400),
    ("GET", "/gate/v1/capacity?model=%20", 400),
    ("GET", "/gate/v1/status?x=%zz", 200),
    ("GET", "/gate/v1/nothing", 404),
    ("GET", "/static/..%2f..%2fapp.py", 404),
    ("PUT", "/gate/v1/status", 405),
    ("POST", "/gate/v1/health", 405),
    ("GET", f"{LEASES}/1/renew", 405),
]


@pytest.mark.parametrize(("method", "path", "expected"), HOSTILE_ROUTES)
async def test_hostile_paths_and_queries_get_the_api_s_answer(
    stack, no_traceback, method, path, expected
):
    status, headers, answer = await send(stack, method, path, b'{"a": ' * 100)
    assert status == expected, answer
    if expected >= 400:
        assert set(answer) == {"error"} and set(answer["error"]) == {"class", "message"}
    if expected == 405:
        assert answer["error"]["class"] == "METHOD_NOT_ALLOWED" and headers["Allow"]
    assert stack.gate.core.leases() == [] and stack.gate.core.waiting() == []
    assert stack.gate.core.operator.paused() == []
