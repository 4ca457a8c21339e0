"""Bearer tokens on the control API: every state-changing route refuses a request without one."""

from __future__ import annotations

import aiohttp
import pytest

from gpugate.config.loader import load_config_text
from gpugate.control.app import control_app
from gpugate.control.auth import READ_ONLY, reads_are_public
from gpugate.control.metrics import GateMetrics
from tests.control.conftest import admin, trainer


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
    from gpugate.config.loader import load_config_text_with_warnings
    from gpugate.reload import unset_secrets

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
