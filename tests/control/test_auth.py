"""Bearer tokens on the control API: every state-changing route refuses a request without one."""

from __future__ import annotations

import asyncio
import json
import logging
import socket
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from gpugate.control.app import control_app
from gpugate.control.auth import READ_ONLY, Throttle, readable, reads_are_public, token_middleware
from gpugate.control.metrics import GateMetrics
from gpugate.runtimes.sections import load_config_text
from tests.control.conftest import CONTROL_TOKEN, admin, trainer


class _AnyPart(dict):
    # Every path parameter ({id}, {consumer}, {index}, ...) filled with "1".
    def __missing__(self, key: str) -> str:
        return "1"


ANY_PART = _AnyPart()


def state_changing_routes(gate) -> list[tuple[str, str]]:
    """(method, path) of every route on the control app that is not read-only."""
    app = control_app(gate, GateMetrics(gate))
    routes = []
    for route in app.router.routes():
        if route.method in READ_ONLY or route.method == "*":
            continue
        info = route.resource.get_info()
        path = info.get("path") or info["formatter"].format_map(ANY_PART)
        routes.append((route.method, path))
    return routes


async def test_every_state_changing_route_needs_a_valid_token(stack):
    routes = state_changing_routes(stack.gate)
    assert ("POST", "/gate/v1/leases") in routes
    assert ("DELETE", "/gate/v1/leases/1") in routes
    assert ("POST", "/gate/v1/leases/1/renew") in routes
    async with aiohttp.ClientSession() as session:
        for method, path in routes:
            for headers in (
                {},
                {"Authorization": "Bearer wrong-token"},
                {"Authorization": "Basic Y29udHJvbDpzZWNyZXQ="},
            ):
                async with session.request(
                    method, stack.control_url + path, headers=headers, json={"bytes": 1}
                ) as resp:
                    assert resp.status == 401, (method, path, headers)
                    assert resp.headers["WWW-Authenticate"].startswith("Bearer")
                    body = await resp.json()
                    assert body["error"]["class"] == "UNAUTHORIZED"
    assert stack.gate.core.leases() == [] and stack.gate.core.waiting() == []


async def test_reads_are_public_on_loopback_and_a_token_opens_the_rest(stack):
    async with aiohttp.ClientSession() as session:
        async with session.get(stack.control_url + "/gate/v1/leases") as resp:
            assert resp.status == 200
        async with session.post(
            stack.control_url + "/gate/v1/leases",
            headers=admin(),
            json={"consumer": "ollama", "bytes": "1GiB", "ttl": 30},
        ) as resp:
            assert resp.status == 201, await resp.text()
            lease_id = (await resp.json())["id"]
        async with session.delete(
            stack.control_url + f"/gate/v1/leases/{lease_id}", headers=admin()
        ) as resp:
            assert resp.status == 200
    assert stack.gate.core.leases() == []


async def test_an_identity_token_holds_leases_only_as_that_identity(stack):
    async with aiohttp.ClientSession() as session:
        post = stack.control_url + "/gate/v1/leases"
        async with session.post(post, headers=trainer(), json={"bytes": "1GiB"}) as resp:
            assert resp.status == 201, await resp.text()
            lease = await resp.json()
        assert lease["identity"] == "trainer" and lease["class"] == "background"
        async with session.post(
            post, headers=trainer(), json={"consumer": "ollama", "bytes": "1GiB"}
        ) as resp:
            assert resp.status == 400
        async with session.post(
            post, headers=trainer(), json={"identity": "other", "bytes": "1GiB"}
        ) as resp:
            assert resp.status == 400
        async with session.post(
            post, headers=trainer(), json={"bytes": "1GiB", "class": "production"}
        ) as resp:
            assert resp.status == 400
            assert "above this identity's interactive" in (await resp.json())["error"]["message"]
        other = {"Authorization": "Bearer other-secret-token"}
        async with session.delete(f"{post}/{lease['id']}", headers=other) as resp:
            assert resp.status == 409
            assert resp.headers["X-GPUGate-Failure"] == "LEASE_CONFLICT"
        async with session.get(stack.control_url + "/gate/v1/status", headers=trainer()) as resp:
            assert resp.status == 200  # public on loopback anyway
        async with session.delete(f"{post}/{lease['id']}", headers=trainer()) as resp:
            assert resp.status == 200
    assert stack.gate.core.leases() == []


@pytest.mark.parametrize(
    ("control", "public", "expected"),
    [
        ("127.0.0.1:9411", None, True),
        ("[::1]:9411", None, True),
        ("0.0.0.0:9411", None, False),
        ("192.168.1.5:9411", None, False),
        ("0.0.0.0:9411", True, True),
        ("127.0.0.1:9411", False, False),
    ],
)
def test_reads_are_public_by_default_only_on_loopback(tmp_path, control, public, expected):
    line = "" if public is None else f"\n  control_public: {str(public).lower()}"
    text = f"gate:\n  control: '{control}'{line}\n"
    config = load_config_text(text, tmp_path / "consumers.yaml")
    assert reads_are_public(config) is expected


async def test_reads_need_the_token_when_not_public(stack):
    import attrs

    gate = stack.gate
    gate.config = attrs.evolve(
        gate.config, gate=attrs.evolve(gate.config.gate, control_public=False)
    )
    async with aiohttp.ClientSession() as session:
        for path in ("/metrics", "/gate/v1/status", "/gate/v1/events", "/gate/v1/leases"):
            async with session.get(stack.control_url + path) as resp:
                assert resp.status == 401, path
                assert resp.headers["WWW-Authenticate"].startswith("Bearer")
            async with session.get(stack.control_url + path, headers=admin()) as resp:
                assert resp.status == 200, path


def test_control_tokens_come_from_the_environment_or_a_file(tmp_path):
    from gpugate.reload import unset_secrets
    from gpugate.runtimes.sections import load_config_text_with_warnings

    token_file = tmp_path / "control.token"
    token_file.write_text("from-the-file\n")
    text = (
        "gate:\n  control_tokens:\n"
        f"    - env:GPUGATE_CONTROL_TOKEN\n    - file:{token_file}\n    - literal-token\n"
    )
    loaded = load_config_text_with_warnings(
        text, tmp_path / "consumers.yaml", {"GPUGATE_CONTROL_TOKEN": "from-the-env"}
    )
    assert loaded.config.gate.control_tokens == ("from-the-env", "from-the-file", "literal-token")
    assert unset_secrets(loaded.warnings) is None

    missing = text.replace(str(token_file), str(tmp_path / "absent.token"))
    loaded = load_config_text_with_warnings(missing, tmp_path / "consumers.yaml", {})
    assert loaded.config.gate.control_tokens == ("literal-token",)
    assert [w.path for w in loaded.warnings if w.unset_variable] == [
        "gate.control_tokens[0]",
        "gate.control_tokens[1]",
    ]
    line = unset_secrets(loaded.warnings)
    assert line is not None and "absent.token cannot be read" in line
    assert "GPUGATE_CONTROL_TOKEN (" in line


# -- Host on a loopback listener, and tokens that are not text --------------------------------


async def raw(port: int, head: bytes) -> tuple[int, bytes, bytes]:
    """Send `head` (a request without a body) as written; status, head and body of the answer."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(head)
        await writer.drain()
        answer = await asyncio.wait_for(reader.read(65536), 10)
    finally:
        writer.close()
    head_out, _, body = answer.partition(b"\r\n\r\n")
    return int(head_out.split(b" ", 2)[1]), head_out, body


def request(target: str, host: str, *more: bytes, method: bytes = b"GET") -> bytes:
    lines = [method + b" " + target.encode() + b" HTTP/1.1", b"Host: " + host.encode()]
    lines += [*more, b"Connection: close", b"Content-Length: 0"]
    return b"\r\n".join(lines) + b"\r\n\r\n"


def guarded_app(control: str) -> web.Application:
    config = load_config_text(
        f"gate:\n  control: '{control}'\n  control_tokens: [{CONTROL_TOKEN}]\n",
        Path("consumers.yaml"),
    )

    async def ok(request: web.Request) -> web.Response:
        return web.Response(text="ok")

    app = web.Application(middlewares=[token_middleware(lambda: config)])
    app.router.add_get("/gate/v1/status", ok)
    app.router.add_post("/gate/v1/leases", ok)
    return app


@pytest.fixture
async def loopback_control():
    server = TestServer(guarded_app("127.0.0.1:9411"), host="127.0.0.1")
    await server.start_server()
    yield server.port
    await server.close()


@pytest.mark.parametrize(
    ("target", "host", "status"),
    [
        ("/gate/v1/status", "127.0.0.1:9411", 200),
        ("/gate/v1/status", "localhost:9411", 200),
        ("/gate/v1/status", "[::1]:9411", 200),
        ("/gate/v1/status", "192.168.1.5:9411", 200),
        ("/gate/v1/status", "10.0.0.1", 200),
        ("/gate/v1/status", "gpu-box.local:9411", 200),
        ("/gate/v1/status", "app.localhost", 200),
        ("/gate/v1/status", "gpu.internal:9411", 200),
        ("/gate/v1/status", socket.gethostname(), 200),
        # A page whose own name was rebound to 127.0.0.1 still names itself in Host.
        ("/gate/v1/status", "evil.example:9411", 403),
        ("/gate/v1/status", "evil.example", 403),
        ("/gate/v1/status", "localhost.evil.example", 403),
        ("/gate/v1/status", "8.8.8.8:9411", 403),
        # Python's is_private is wider than the rule's RFC 1918/4193 ranges.
        ("/gate/v1/status", "192.0.2.1", 403),
        # The absolute-form target's host counts too.
        ("http://evil.example/gate/v1/status", "127.0.0.1:9411", 403),
        ("http://127.0.0.1:9411/gate/v1/status", "127.0.0.1:9411", 200),
    ],
)
async def test_a_loopback_control_listener_answers_only_local_host_names(
    loopback_control, target, host, status
):
    got, _, body = await raw(loopback_control, request(target, host))
    assert got == status, (target, host)
    if status == 403:
        assert body == b""


async def test_a_foreign_host_is_refused_before_the_token_is_looked_at(loopback_control):
    bearer = f"Authorization: Bearer {CONTROL_TOKEN}".encode()
    got, _, _ = await raw(
        loopback_control, request("/gate/v1/leases", "evil.example", bearer, method=b"POST")
    )
    assert got == 403


async def test_a_control_listener_on_another_address_has_no_host_rule():
    server = TestServer(guarded_app("0.0.0.0:9411"), host="127.0.0.1")
    await server.start_server()
    try:
        bearer = f"Authorization: Bearer {CONTROL_TOKEN}".encode()
        got, _, _ = await raw(server.port, request("/gate/v1/status", "gpu.example", bearer))
        assert got == 200
        got, _, _ = await raw(server.port, request("/gate/v1/status", "gpu.example"))
        assert got == 401  # reads are not public there
    finally:
        await server.close()


@pytest.mark.parametrize("token", [b"\xff", b"ok\xe9", b"\xc3\x28", b"\x80abc"])
async def test_a_token_that_is_not_text_is_refused_cleanly(loopback_control, token, caplog):
    bearer = b"Authorization: Bearer " + token
    # A public read ignores it; a write refuses it as any unknown token: never a 500.
    got, _, body = await raw(loopback_control, request("/gate/v1/status", "127.0.0.1", bearer))
    assert (got, body) == (200, b"ok")
    got, head, body = await raw(
        loopback_control, request("/gate/v1/leases", "127.0.0.1", bearer, method=b"POST")
    )
    assert got == 401
    assert b"WWW-Authenticate: Bearer" in head
    assert json.loads(body)["error"]["message"] == "the bearer token is not valid here"
    assert "Traceback" not in caplog.text


async def test_unreadable_tokens_are_logged_once_per_interval(loopback_control, caplog):
    caplog.set_level(logging.WARNING, logger="gpugate.control.auth")
    bearer = b"Authorization: Bearer \xff"
    for _ in range(5):
        got, _, _ = await raw(loopback_control, request("/gate/v1/status", "127.0.0.1", bearer))
        assert got == 200
    warnings = [r for r in caplog.records if "not UTF-8 text" in r.getMessage()]
    assert len(warnings) == 1


def test_the_throttle_lets_one_line_through_per_interval():
    now = [100.0]
    throttle = Throttle(60.0, clock=lambda: now[0])
    assert throttle.allow() is True
    assert [throttle.allow() for _ in range(3)] == [False, False, False]
    assert throttle.suppressed == 3
    now[0] += 60.0
    assert throttle.allow() is True


def test_readable():
    assert readable("plain-token") and readable("caf\u00e9")
    assert not readable("\udcff")
