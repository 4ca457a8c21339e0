"""Ollama's Host and Origin checks through the gate are those of Ollama at the gate's address.

The simulated Ollama is the reference where it follows Ollama v0.24.0; browser origins,
preflights and absolute-form request lines are checked against answers written from the
source (gin-contrib/cors v1.7.2 with Ollama's configuration, gin v1.10.0, net/http).
"""

from __future__ import annotations

import asyncio
import json

import aiohttp
import attrs
import pytest

from tests.gate.harness import running_stack
from tests.proxy.conftest import CORS_HEADERS, Answer, ask

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
    ("GET", "/api/tags", {"Host": "evil.example", "Origin": LOCAL}, None),
    (
        "GET",
        "/api/version",
        {"Host": "192.168.1.20:11434", "Origin": "https://app.example.com"},
        None,
    ),
    ("OPTIONS", "/api/tags", {"Host": "127.0.0.1:11434"}, None),
    ("GET", "/nope", {"Host": "localhost:11434", "Origin": LOCAL}, None),
    ("OPTIONS", "/api/chat", {"Host": "localhost:11434", **PREFLIGHT}, None),
    ("OPTIONS", "/api/chat", {"Host": "localhost:11434", "Origin": "http://example.com"}, None),
    ("OPTIONS", "/api/tags", {"Host": "localhost:11434"}, None),
    *(
        ("GET", "/api/version", {"Host": "localhost:11434", "Origin": origin}, None)
        for origin in [
            "http://localhostevil.example",
            "http://localhost.evil.example",
            "http://127.0.0.1.evil.example",
            "https://0.0.0.0.evil.example",
            "http://localhost@evil.example",
            "http://localhost, http://evil.example",
        ]
    ),
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


# -- browser origins, from the source ---------------------------------------------------------

REFUSED_ORIGINS = [
    "http://localhostevil.example",
    "http://localhost.evil.example",
    "http://127.0.0.1.evil.example",
    "http://localhost@evil.example",
    "http://localhost, http://evil.example",
    "https://localhost.evil.example",
    "http://0.0.0.0.evil.example",
    "http://localhost.evil.com",
    "HTTP://LOCALHOST:3000",
]
ALLOWED_ORIGINS = [
    "http://localhost:3000",
    "https://127.0.0.1",
    "app://x",
    "vscode-webview://abc",
    "chrome-extension://abcdefghijklmnop",  # allowed by this consumer's origins
]
EXTENSIONS_YAML = "origins: ['chrome-extension://*']\n"
PREFLIGHT_ALLOW_HEADERS = (
    "Authorization,Content-Type,User-Agent,Accept,X-Requested-With,Openai-Beta,"
    "X-Stainless-Arch,X-Stainless-Async,X-Stainless-Custom-Poll-Interval,"
    "X-Stainless-Helper-Method,X-Stainless-Lang,X-Stainless-Os,X-Stainless-Package-Version,"
    "X-Stainless-Poll-Helper,X-Stainless-Retry-Count,X-Stainless-Runtime,"
    "X-Stainless-Runtime-Version,X-Stainless-Timeout"
)
REQUESTS = [
    ("GET", "/api/tags", None),
    ("POST", "/api/generate", LOAD),
    ("OPTIONS", "/api/chat", None),
]


def cors_answer(
    origin: str | None = None, *, preflight: bool = False, allow: str = ""
) -> tuple[tuple[str, tuple[str, ...]], ...]:
    """The CORS_HEADERS part of an Answer as Ollama writes it."""
    values: dict[str, tuple[str, ...]] = {}
    if origin is not None:
        values["Access-Control-Allow-Origin"] = (origin,)
        values["Vary"] = ("Origin",)
    if preflight:
        values["Access-Control-Allow-Methods"] = ("GET,POST,PUT,PATCH,DELETE,HEAD,OPTIONS",)
        values["Access-Control-Allow-Headers"] = (PREFLIGHT_ALLOW_HEADERS,)
        values["Access-Control-Max-Age"] = ("43200",)
        values["Vary"] = (
            "Origin",
            "Access-Control-Request-Method",
            "Access-Control-Request-Headers",
        )
    if allow:
        values["Allow"] = (allow,)
    return tuple((name, values.get(name, ())) for name in CORS_HEADERS)


@pytest.fixture
async def extensions_stack(tmp_path, sim_host, fakenvml_path):
    def spec(s):
        return attrs.evolve(s, origins=("chrome-extension://*",))

    async with running_stack(
        tmp_path, sim_host, fakenvml_path, spec=spec, consumer_yaml=EXTENSIONS_YAML
    ) as stack:
        yield stack


async def test_an_origin_ollama_refuses_is_refused_by_the_gate_before_anything_loads(
    extensions_stack,
):
    stack = extensions_stack
    async with aiohttp.ClientSession() as session:
        for origin in REFUSED_ORIGINS:
            for method, path, body in REQUESTS:
                headers = {"Host": "localhost:11434", "Origin": origin}
                if method == "OPTIONS":
                    headers["Access-Control-Request-Method"] = "POST"
                got = await ask(session, stack.gate_url, method, path, headers, body)
                # AbortWithStatus(403): no body, no type; gin's Allow on another method's path.
                allow = "POST" if method == "OPTIONS" else ""
                expected = Answer(403, b"", None, "0", cors_answer(allow=allow), None)
                assert got == expected, (origin, method, path)
    assert await stack.ps() == []
    assert stack.gate.core.leases() == [] and stack.gate.core.waiting() == []


async def test_an_origin_ollama_allows_gets_its_cors_headers_and_preflight(extensions_stack):
    stack = extensions_stack
    async with aiohttp.ClientSession() as session:
        for origin in ALLOWED_ORIGINS:
            headers = {"Host": "localhost:11434", "Origin": origin}
            tags = await ask(session, stack.gate_url, "GET", "/api/tags", headers)
            assert (tags.status, tags.cors) == (200, cors_answer(origin)), origin
            load = await ask(session, stack.gate_url, "POST", "/api/generate", headers, LOAD)
            assert (load.status, load.cors) == (200, cors_answer(origin)), origin
            asked = {**headers, "Access-Control-Request-Method": "POST"}
            pre = await ask(session, stack.gate_url, "OPTIONS", "/api/chat", asked)
            expected = Answer(204, b"", None, None, cors_answer(origin, preflight=True,
                                                               allow="POST"), None)  # fmt: skip
            assert pre == expected, origin


async def raw_request(url: str, head: bytes) -> tuple[int, bytes]:
    """One request written as given; the answer's status and body."""
    port = int(url.rsplit(":", 1)[1])
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(head)
        await writer.drain()
        answer = await asyncio.wait_for(reader.read(1 << 20), 30)
    finally:
        writer.close()
    head_out, _, body = answer.partition(b"\r\n\r\n")
    return int(head_out.split(b" ", 2)[1]), body


async def test_an_absolute_form_request_line_is_judged_by_its_own_host(stack):
    # net/http takes Request.Host from the absolute URL; the Host header is ignored.
    tags = b"GET http://evil.example/api/tags HTTP/1.1\r\nHost: localhost\r\n\r\n"
    assert await raw_request(stack.gate_url, tags) == (403, b"")
    load = (
        b"POST http://evil.example:11434/api/generate HTTP/1.1\r\nHost: localhost:11434\r\n"
        b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(LOAD) + LOAD
    )
    assert await raw_request(stack.gate_url, load) == (403, b"")
    assert await stack.ps() == []
    assert stack.gate.core.leases() == []
    local = b"GET http://localhost:11434/api/tags HTTP/1.1\r\nHost: evil.example\r\n\r\n"
    status, _ = await raw_request(stack.gate_url, local)
    assert status == 200
