"""Scoped control tokens: each route needs one scope; a known token without it gets 403."""

from __future__ import annotations

import io
import json

import aiohttp
import attrs
import pytest

from gpugate.config.loader import ConfigError
from gpugate.config.model import ALL_SCOPES, ControlToken, Scope
from gpugate.control.app import control_app
from gpugate.control.auth import ASK_LEASE, READ_ONLY, ROUTE_SCOPES, required_scopes
from gpugate.control.metrics import GateMetrics
from gpugate.control.openapi import openapi_document
from gpugate.reload import unset_secrets
from gpugate.runtimes.sections import load_config_text, load_config_text_with_warnings
from tests.control.test_auth import ANY_PART
from tests.control.test_views_cli import gpugate
from tests.gate.harness import running_stack

TOKENS = {
    Scope.READ: "read-scope-token",
    Scope.LEASE: "lease-scope-token",
    Scope.ADMIT: "admit-scope-token",
    Scope.OPERATE: "operate-scope-token",
}
FULL = "full-control-token"
TOKENS_YAML = f"""\
gate:
  control_tokens:
    - {FULL}
    - {{token: {TOKENS[Scope.READ]}, scopes: [read]}}
    - {{token: {TOKENS[Scope.LEASE]}, scopes: [lease]}}
    - token: {TOKENS[Scope.ADMIT]}
      scopes: [admit]
    - {{token: {TOKENS[Scope.OPERATE]}, scopes: [operate]}}
"""


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


@pytest.fixture
async def stack(tmp_path, sim_host, fakenvml_path):
    # The ollama consumer has an envelope, so a start lease can be asked for it.
    async with running_stack(
        tmp_path, sim_host, fakenvml_path, consumer_yaml="envelope: 1GiB\n"
    ) as stack:
        tokens = load_config_text(TOKENS_YAML, tmp_path / "tokens.yaml").gate.control_tokens
        gate = stack.gate
        # Reads are not public here: every GET needs the read scope too.
        gate.config = attrs.evolve(
            gate.config,
            gate=attrs.evolve(gate.config.gate, control_tokens=tokens, control_public=False),
        )
        yield stack


def routes(gate) -> list[tuple[str, str, str]]:
    """(method, route pattern, a path to it) of every route of the control app."""
    app = control_app(gate, GateMetrics(gate))
    found = []
    for route in app.router.routes():
        if route.method in ("HEAD", "*"):
            continue
        info = route.resource.get_info()
        pattern = info.get("path") or info["formatter"]
        path = info.get("path") or info["formatter"].format_map(ANY_PART)
        found.append((route.method, pattern, path))
    return found


async def ask(session, stack, method: str, path: str, token: str, body=None) -> tuple[int, dict]:
    url = stack.control_url + path
    # A stream answers its headers at once and goes on: only the status is read.
    timeout = aiohttp.ClientTimeout(total=10)
    async with session.request(
        method, url, headers=bearer(token), json=body, timeout=timeout
    ) as resp:
        if resp.status not in (401, 403):
            return resp.status, {}
        challenge = resp.headers.get("WWW-Authenticate", "")
        return resp.status, {**await resp.json(), "challenge": challenge}


async def test_each_scope_opens_its_routes_and_403s_the_others(stack):
    found = routes(stack.gate)
    assert len(found) > 10
    async with aiohttp.ClientSession() as session:
        for method, pattern, path in found:
            needed = required_scopes(method, pattern)
            if (method, pattern) == ASK_LEASE:
                needed = (Scope.LEASE,)  # {"bytes": 1} asks to hold; a start is `admit`'s
            for scope, token in TOKENS.items():
                # Every write here names nothing that exists (lease 1, GPU 1, consumer 1) or
                # asks for nothing readable ({"bytes": 1}): an allowed one has no effect.
                body = {"bytes": 1} if method == "POST" else None
                status, answer = await ask(session, stack, method, path, token, body)
                if scope in needed:
                    assert status not in (401, 403), (method, path, scope, answer)
                    continue
                assert status == 403, (method, path, scope, status)
                error = answer["error"]
                assert error["class"] == "FORBIDDEN"
                named = " or ".join(f"'{s.value}'" for s in needed)
                assert f"do not include {named}, which {method} {pattern}" in error["message"]
                assert f"({scope.value})" in error["message"]
                assert 'error="insufficient_scope"' in answer["challenge"]
            # The bare entry keeps today's meaning: every route.
            body = {"bytes": 1} if method == "POST" else None
            status, _ = await ask(session, stack, method, path, FULL, body)
            assert status not in (401, 403), (method, path)
    assert stack.gate.core.leases() == [] and stack.gate.core.operator.paused() == []


async def test_unknown_tokens_stay_401(stack):
    async with aiohttp.ClientSession() as session:
        for method, path in (("POST", "/gate/v1/gpus/0/pause"), ("GET", "/gate/v1/status")):
            status, answer = await ask(session, stack, method, path, "not-a-token")
            assert status == 401 and answer["error"]["class"] == "UNAUTHORIZED"
            async with session.request(method, stack.control_url + path) as resp:
                assert resp.status == 401


async def test_lease_scope_holds_renews_and_releases_and_nothing_else(stack):
    lease_token, operate = TOKENS[Scope.LEASE], TOKENS[Scope.OPERATE]
    hold = {"consumer": "ollama", "bytes": "1GiB", "ttl": 30}
    async with aiohttp.ClientSession() as session:
        post = stack.control_url + "/gate/v1/leases"
        async with session.post(post, headers=bearer(operate), json=hold) as resp:
            assert resp.status == 403
            assert "'lease'" in (await resp.json())["error"]["message"]
        async with session.post(post, headers=bearer(lease_token), json=hold) as resp:
            assert resp.status == 201, await resp.text()
            lease_id = (await resp.json())["id"]
        renew = f"{post}/{lease_id}/renew"
        async with session.post(renew, headers=bearer(TOKENS[Scope.ADMIT])) as resp:
            assert resp.status == 403
        async with session.post(renew, headers=bearer(lease_token)) as resp:
            assert resp.status == 200
        async with session.delete(f"{post}/{lease_id}", headers=bearer(operate)) as resp:
            assert resp.status == 403
        assert len(stack.gate.core.leases()) == 1
        async with session.delete(f"{post}/{lease_id}", headers=bearer(lease_token)) as resp:
            assert resp.status == 200
    assert stack.gate.core.leases() == []


async def test_admit_scope_asks_for_start_leases_only(stack):
    admit, lease_token = TOKENS[Scope.ADMIT], TOKENS[Scope.LEASE]
    start = {"consumer": "ollama", "purpose": "start"}
    async with aiohttp.ClientSession() as session:
        post = stack.control_url + "/gate/v1/leases"
        async with session.post(post, headers=bearer(lease_token), json=start) as resp:
            assert resp.status == 403
            message = (await resp.json())["error"]["message"]
            assert "do not include 'admit'" in message and '"purpose": "start"' in message
        hold = {"consumer": "ollama", "bytes": "1GiB"}
        async with session.post(post, headers=bearer(admit), json=hold) as resp:
            assert resp.status == 403
            assert "do not include 'lease'" in (await resp.json())["error"]["message"]
        # A body the handler cannot read is its 400, to either scope.
        async with session.post(post, headers=bearer(admit), data=b"not json") as resp:
            assert resp.status == 400
        assert stack.gate.core.leases() == []
        async with session.post(post, headers=bearer(admit), json=start) as resp:
            assert resp.status == 201, await resp.text()
            document = await resp.json()
    assert document["purpose"] == "start" and document["consumer"] == "ollama"
    assert [lease.id for lease in stack.gate.core.leases()] == [document["id"]]


async def test_operate_scope_pauses_drains_and_cannot_lease(stack):
    operate = TOKENS[Scope.OPERATE]
    async with aiohttp.ClientSession() as session:
        base = stack.control_url + "/gate/v1"
        async with session.post(f"{base}/gpus/0/pause", headers=bearer(operate)) as resp:
            assert resp.status == 200
        assert stack.gate.core.operator.paused() == [0]
        async with session.post(f"{base}/gpus/0/resume", headers=bearer(TOKENS[Scope.READ])) as r:
            assert r.status == 403
            assert "do not include 'operate'" in (await r.json())["error"]["message"]
        async with session.post(f"{base}/gpus/0/resume", headers=bearer(operate)) as resp:
            assert resp.status == 200
        async with session.post(f"{base}/consumers/ollama/drain", headers=bearer(operate)) as r:
            assert r.status == 200
        async with session.post(f"{base}/consumers/ollama/undrain", headers=bearer(operate)) as r:
            assert r.status == 200
        # Reads need the read scope: not public here.
        async with session.get(f"{base}/status", headers=bearer(operate)) as resp:
            assert resp.status == 403
        async with session.get(f"{base}/status", headers=bearer(TOKENS[Scope.READ])) as resp:
            assert resp.status == 200
    assert stack.gate.core.operator.paused() == []


async def test_public_reads_answer_any_token(stack):
    gate = stack.gate
    gate.config = attrs.evolve(
        gate.config, gate=attrs.evolve(gate.config.gate, control_public=None)
    )
    async with aiohttp.ClientSession() as session:
        for token in TOKENS.values():
            async with session.get(
                stack.control_url + "/gate/v1/status", headers=bearer(token)
            ) as resp:
                assert resp.status == 200


async def test_every_write_route_has_its_scope_and_openapi_names_each(stack):
    writes = {(m, p) for m, p, _ in routes(stack.gate) if m not in READ_ONLY}
    # A write route left out of the table would need `operate`: that must be a choice.
    assert writes == set(ROUTE_SCOPES)
    document = openapi_document()
    for path, item in document["paths"].items():
        for method, operation in item.items():
            scopes = [s.value for s in required_scopes(method.upper(), path)]
            assert operation["x-gpugate-scopes"] == scopes, (method, path)
            if method != "get":
                assert operation["security"] == [{"bearer": [s]} for s in scopes]
                assert "403" in operation["responses"] and "401" in operation["responses"]
    start = document["paths"]["/gate/v1/leases"]["post"]
    assert start["x-gpugate-scopes"] == ["lease", "admit"]
    schema = start["requestBody"]["content"]["application/json"]["schema"]
    assert schema["properties"]["purpose"]["enum"] == ["hold", "start"]


# -- The CLI's token: the unit's credential first ---------------------------------------------


async def test_the_cli_presents_the_unit_s_credential_before_other_tokens(
    stack, tmp_path, monkeypatch
):
    credentials = tmp_path / "credentials"
    credentials.mkdir()
    monkeypatch.setenv("CREDENTIALS_DIRECTORY", str(credentials))
    # $GPUGATE_TOKEN is a token the gate does not know: were it presented, 401.
    monkeypatch.setenv("GPUGATE_TOKEN", "not-a-token")

    # An admit-only credential (whisper-server's drop-in) admits a start and can do no more.
    (credentials / "gpugate-token").write_text(TOKENS[Scope.ADMIT] + "\n")
    code, out, err = await gpugate(stack, tmp_path, "admit", "ollama", "--wait", "5s")
    assert code == 0, err
    assert out.startswith("gpugate admit: ollama: start lease ")
    code, out, err = await gpugate(stack, tmp_path, "pause", "--gpu", "0")
    assert code != 0 and out == ""
    assert err.startswith("gpugate pause: FORBIDDEN: ") and "'operate'" in err
    assert err.count("\n") == 1
    assert stack.gate.core.operator.paused() == []

    (credentials / "gpugate-token").write_text(TOKENS[Scope.OPERATE] + "\n")
    code, out, err = await gpugate(stack, tmp_path, "pause", "--gpu", "0")
    assert (code, out, err) == (0, "GPU 0: paused\n", "")
    assert stack.gate.core.operator.paused() == [0]

    # Without the credential file, $GPUGATE_TOKEN is next.
    (credentials / "gpugate-token").unlink()
    monkeypatch.setenv("GPUGATE_TOKEN", TOKENS[Scope.OPERATE])
    code, out, err = await gpugate(stack, tmp_path, "resume", "--gpu", "0")
    assert (code, out) == (0, "GPU 0: admitting\n"), err


def test_the_token_order_credential_environment_configuration(tmp_path, monkeypatch):
    from gpugate.commands.control_client import control_address

    config = tmp_path / "consumers.yaml"
    config.write_text("gate:\n  control: 127.0.0.1:9411\n  control_tokens: [from-the-file]\n")
    credentials = tmp_path / "credentials"
    credentials.mkdir()
    (credentials / "gpugate-token").write_text("from-the-credential\nsecond line\n")
    monkeypatch.setenv("CREDENTIALS_DIRECTORY", str(credentials))
    monkeypatch.setenv("GPUGATE_TOKEN", "from-the-environment")
    assert control_address(config)[1] == "from-the-credential"
    (credentials / "gpugate-token").unlink()
    assert control_address(config)[1] == "from-the-environment"
    monkeypatch.delenv("GPUGATE_TOKEN")
    assert control_address(config)[1] == "from-the-file"
    monkeypatch.delenv("CREDENTIALS_DIRECTORY")
    assert control_address(config)[1] == "from-the-file"


# -- Configuration -------------------------------------------------------------------------------


def test_entries_carry_scopes_and_a_bare_entry_grants_all(tmp_path):
    tokens = load_config_text(TOKENS_YAML, tmp_path / "consumers.yaml").gate.control_tokens
    assert tokens == (FULL, *TOKENS.values())  # each is its token's text
    assert [t.scopes for t in tokens] == [ALL_SCOPES, *({s} for s in TOKENS)]
    assert all(isinstance(t, ControlToken) for t in tokens)


def test_a_bad_scope_is_reported_with_file_line_and_field(tmp_path):
    from gpugate.config.check import EXIT_INVALID, run_check
    from gpugate.runtimes.sections import RUNTIME_TABLE

    path = tmp_path / "consumers.yaml"
    path.write_text(
        "gate:\n"
        "  control_tokens:\n"
        "    - literal-token\n"
        "    - token: other-token\n"
        "      scopes: [admit, opperate]\n"
        "    - {token: third-token, scopes: []}\n"
        "    - {token: fourth-token, scope: [read]}\n"
        "    - {scopes: [read]}\n"
    )
    out, err = io.StringIO(), io.StringIO()
    assert run_check(path, out, err, runtimes=RUNTIME_TABLE) == EXIT_INVALID
    lines = [line for line in err.getvalue().splitlines() if "warning" not in line]
    assert lines == [
        f"{path}:5: gate.control_tokens[1].scopes[1]: unknown scope 'opperate' "
        "(one of admit, lease, operate, read); did you mean 'operate'?",
        f"{path}:6: gate.control_tokens[2].scopes: a token needs at least one scope "
        "(admit, lease, operate, read)",
        f"{path}:7: gate.control_tokens[3].scope: unknown key 'scope'; did you mean 'scopes'?",
        f"{path}:8: gate.control_tokens[4]: missing required field 'token'",
    ]


def test_credential_tokens_come_from_the_unit_s_credentials(tmp_path):
    credentials = tmp_path / "credentials"
    credentials.mkdir()
    (credentials / "control.token").write_text("from-the-credential\n")
    fallback = tmp_path / "admit.token"
    fallback.write_text("from-the-fallback-file\n")
    text = (
        "gate:\n  control_tokens:\n"
        "    - credential:control.token\n"
        f"    - {{token: 'credential:admit.token:{fallback}', scopes: [admit]}}\n"
    )
    source = tmp_path / "consumers.yaml"
    environ = {"CREDENTIALS_DIRECTORY": str(credentials)}
    loaded = load_config_text_with_warnings(text, source, environ)
    tokens = loaded.config.gate.control_tokens
    # admit.token is not among the unit's credentials: its file is read instead.
    assert tokens == ("from-the-credential", "from-the-fallback-file")
    assert tokens[1].scopes == {Scope.ADMIT}
    assert unset_secrets(loaded.warnings) is None

    (credentials / "admit.token").write_text("admit-credential\n")
    tokens = load_config_text_with_warnings(text, source, environ).config.gate.control_tokens
    assert tokens == ("from-the-credential", "admit-credential")

    # Outside the unit (`gpugate check` in a shell): the file if readable, else a warning
    # that stops `gpugate serve` and says which LoadCredential= is missing.
    loaded = load_config_text_with_warnings(text, source, {})
    assert loaded.config.gate.control_tokens == ("from-the-fallback-file",)
    (warning,) = [w for w in loaded.warnings if w.unset_variable]
    assert warning.path == "gate.control_tokens[0]" and warning.line == 3
    line = unset_secrets(loaded.warnings)
    assert line is not None
    assert "credential control.token: $CREDENTIALS_DIRECTORY is not set" in line
    assert "LoadCredential=control.token:PATH" in line

    fallback.unlink()
    loaded = load_config_text_with_warnings(text, source, {})
    assert loaded.config.gate.control_tokens == ()
    line = unset_secrets(loaded.warnings)
    assert line is not None and f"token file {fallback} cannot be read" in line
    assert f"LoadCredential=admit.token:{fallback}" in line


@pytest.mark.parametrize(
    ("written", "message"),
    [
        ("credential:", "expected a credential name after 'credential:'"),
        ("credential:../x", "credential name '../x' is not a file name"),
    ],
)
def test_a_credential_token_names_a_credential(tmp_path, written, message):
    text = f"gate:\n  control_tokens: ['{written}']\n"
    with pytest.raises(ConfigError) as raised:
        load_config_text(text, tmp_path / "consumers.yaml")
    assert f"consumers.yaml:2: gate.control_tokens[0]: {message}" in str(raised.value)


def test_scoped_tokens_change_on_a_reload(tmp_path):
    from gpugate.reload import live_config

    source = tmp_path / "consumers.yaml"
    old = load_config_text("gate:\n  control_tokens: [a-token]\n", source)
    new = load_config_text("gate:\n  control_tokens: [{token: a-token, scopes: [read]}]\n", source)
    (token,) = live_config(old, new).gate.control_tokens
    assert token.scopes == {Scope.READ}


async def test_a_scoped_token_s_403_is_one_json_object(stack):
    # The shape every control error has: {"error": {"class", "message"}}.
    async with (
        aiohttp.ClientSession() as session,
        session.post(
            stack.control_url + "/gate/v1/gpus/0/pause", headers=bearer(TOKENS[Scope.READ])
        ) as resp,
    ):
        assert resp.status == 403
        assert resp.content_type == "application/json"
        body = json.loads(await resp.text())
    assert set(body) == {"error"} and set(body["error"]) == {"class", "message"}
