"""Ollama's Host and Origin checks through the gate are those of Ollama at the gate's address."""

from __future__ import annotations

import json

import aiohttp
import attrs
import pytest

from tests.gate.harness import running_stack
from tests.proxy.conftest import ask

ORIGINS_YAML = "origins: [https://app.example.com]\n"
LOAD = json.dumps({"model": "llama3.2:3b", "prompt": "hi", "stream": False}).encode()
LOCAL = "http://localhost:3000"
PREFLIGHT = {"Origin": LOCAL, "Access-Control-Request-Method": "POST"}

LOOPBACK_CASES = [
    ("GET", "/api/tags", {"Host": "evil.example"}, None),
    ("POST", "/api/generate", {"Host": "evil.example:11434"}, LOAD),
    ("GET", "/api/tags", {"Host": "8.8.8.8:11434"}, None),
    ("GET", "/api/version", {"Host": "gpu-box.local:11434"}, None),
    ("GET", "/api/version", {"Host": "192.168.1.20:11434"}, None),
    (
        "GET",
        "/api/version",
        {"Host": "gpu.example:11434", "Origin": "http://gpu.example:11434"},
        None,
    ),
    (
        "GET",
        "/api/version",
        {"Host": "gpu-box.local:11434", "Origin": "http://gpu-box.local:11434"},
        None,
    ),
    ("GET", "/api/version", {"Host": "localhost:11434", "Origin": "http://example.com"}, None),
    ("GET", "/api/version", {"Host": "localhost:11434", "Origin": LOCAL}, None),
    (
        "GET",
        "/api/version",
        {"Host": "localhost:11434", "Origin": "http://localhost.evil.com"},
        None,
    ),
    ("GET", "/api/tags", {"Host": "evil.example", "Origin": LOCAL}, None),
    (
        "GET",
        "/api/version",
        {"Host": "192.168.1.20:11434", "Origin": "https://app.example.com"},
        None,
    ),
    ("OPTIONS", "/api/chat", {"Host": "localhost:11434", **PREFLIGHT}, None),
    ("OPTIONS", "/api/chat", {"Host": "localhost:11434", "Origin": "http://example.com"}, None),
    ("OPTIONS", "/api/tags", {"Host": "localhost:11434"}, None),
    ("OPTIONS", "/api/tags", {"Host": "127.0.0.1:11434"}, None),
    ("GET", "/nope", {"Host": "localhost:11434", "Origin": LOCAL}, None),
]


def with_origins(spec):
    return attrs.evolve(spec, origins=("https://app.example.com",))


@pytest.mark.parametrize("listen", ["127.0.0.1", "0.0.0.0"])
async def test_a_client_gets_what_ollama_at_the_gates_address_would_answer(
    tmp_path, sim_host, fakenvml_path, listen
):
    def spec(s):
        return attrs.evolve(with_origins(s), listen=f"{listen}:0")

    async with (
        running_stack(
            tmp_path,
            sim_host,
            fakenvml_path,
            spec=spec,
            listen_host=listen,
            consumer_yaml=ORIGINS_YAML,
        ) as stack,
        aiohttp.ClientSession() as session,
    ):
        for method, path, headers, body in LOOPBACK_CASES:
            direct = await ask(session, stack.sim_url, method, path, headers, body)
            gated = await ask(session, stack.gate_url, method, path, headers, body)
            case = (method, path, headers)
            if path == "/api/generate":  # an answer with timings: its length varies
                gated = attrs.evolve(gated, body=b"", content_length=None)
                direct = attrs.evolve(direct, body=b"", content_length=None)
            assert gated == direct, case
            assert gated.server is None, case
        assert stack.gate.core.leases() == [] and stack.gate.core.waiting() == []
        if listen == "127.0.0.1":
            # The refused load never reached Ollama: nothing was loaded, no lease was taken.
            assert stack.sim.state().runners == ()


async def test_a_refused_host_loads_nothing_and_a_same_origin_request_passes(
    tmp_path, sim_host, fakenvml_path
):
    async with (
        running_stack(tmp_path, sim_host, fakenvml_path) as stack,
        aiohttp.ClientSession() as session,
    ):
        refused = await ask(session, stack.gate_url, "POST", "/api/generate",
                            {"Host": "evil.example"}, LOAD)  # fmt: skip
        assert (refused.status, refused.body, refused.content_type) == (403, b"", None)
        assert await stack.ps() == []
        assert stack.gate.core.leases() == []
        same = {"Host": "gpu-box.local:11434", "Origin": "http://gpu-box.local:11434"}
        passed = await ask(session, stack.gate_url, "POST", "/api/generate", same, LOAD)
        assert passed.status == 200
        assert dict(passed.cors)["Access-Control-Allow-Origin"] == ()
        foreign = {"Host": "localhost:11434", "Origin": LOCAL}
        cors = await ask(session, stack.gate_url, "GET", "/api/tags", foreign)
        assert dict(cors.cors)["Access-Control-Allow-Origin"] == (LOCAL,)
        assert dict(cors.cors)["Vary"] == ("Origin",)
