"""ComfyUI's origin check and its --enable-cors-header middleware, as the gate runs them.

Expected answers are written from ComfyUI 0.3.64's server.py (`create_origin_only_middleware`,
`create_cors_middleware`, `is_loopback`), middleware/cache_middleware.py and aiohttp's
answer to a middleware that raises; the consumer's `cors_header` as the loader reads it.
"""

from __future__ import annotations

from pathlib import Path

import attrs
import pytest

from gpugate.config.loader import ConfigError
from gpugate.config.model import Address, Consumer, Upstream
from gpugate.runtimes.answers import ApiFamily, RouteKind
from gpugate.runtimes.comfyui.adapter import ComfyUIReading
from gpugate.runtimes.comfyui.origin import Verdict, origin_verdict, request_path
from gpugate.runtimes.comfyui.settings import ComfyUISettings
from gpugate.runtimes.sections import load_config_text_with_warnings

CONSUMER = Consumer(
    name="comfyui",
    runtime="comfyui",
    listen=Address("127.0.0.1", 8188),
    upstream=Upstream("http", "127.0.0.1", 8189),
)
CHECKING = ComfyUIReading(CONSUMER)
CORS = (
    ("Access-Control-Allow-Origin", "*"),
    ("Access-Control-Allow-Methods", "POST, GET, DELETE, PUT, OPTIONS"),
    ("Access-Control-Allow-Headers", "Content-Type, Authorization"),
    ("Access-Control-Allow-Credentials", "true"),
)


def cors_reading(value: str = "*") -> ComfyUIReading:
    return ComfyUIReading(attrs.evolve(CONSUMER, settings=ComfyUISettings(cors_header=value)))


@pytest.mark.parametrize("method", ["GET", "POST", "OPTIONS"])
@pytest.mark.parametrize(
    ("host", "origin"),
    [
        ("127.0.0.1:8188", "http://evil.example:8188"),
        ("127.0.0.1:8188", "http://evil.example"),
        # The upstream's hidden address: the upstream itself would see Host 127.0.0.1:8189
        # and let it through; ComfyUI at the gate's address refuses it.
        ("127.0.0.1:8188", "http://127.0.0.1:8189"),
        ("localhost:8188", "http://127.0.0.1:8188"),
        ("[::1]:8188", "http://localhost:8188"),
    ],
)
def test_a_mismatched_origin_is_refused_at_the_gate(method, host, origin):
    screening = CHECKING.screen(method, {"Host": host, "Origin": origin}, target="/prompt")
    assert screening.reply is not None
    reply = screening.reply
    assert (reply.status, reply.body, reply.content_type, reply.headers) == (403, b"", "", ())


@pytest.mark.parametrize(
    ("host", "origin"),
    [
        ("127.0.0.1:8188", "http://127.0.0.1:8188"),
        ("127.0.0.1:8188", "https://127.0.0.1:8188"),  # the scheme is ignored
        ("127.0.0.1:8188", "http://127.0.0.1"),  # ports only when both have one
        ("127.0.0.1", "http://127.0.0.1:9999"),
        ("127.0.0.1:8188", "null"),
        ("gpu.example:8188", "http://evil.example"),  # a non-loopback Host skips the check
        ("192.168.1.20:8188", "http://evil.example"),
    ],
)
def test_a_matching_origin_or_a_foreign_host_passes_and_origin_stays_here(host, origin):
    screening = CHECKING.screen("POST", {"Host": host, "Origin": origin}, target="/prompt")
    assert screening.reply is None
    assert screening.drop_up == ("Origin",)
    assert screening.reply_headers == () and screening.response_headers == ()


def test_the_host_header_decides_not_an_absolute_form_target():
    # aiohttp's request.host would be the target's, but the middleware reads headers['Host'].
    headers = {"Host": "127.0.0.1:8188", "Origin": "http://evil.example:8188"}
    refused = CHECKING.screen("GET", headers, target="http://evil.example:8188/prompt")
    assert refused.reply is not None and refused.reply.status == 403
    headers = {"Host": "127.0.0.1:8188", "Origin": "http://127.0.0.1:8188"}
    passed = CHECKING.screen("GET", headers, target="http://evil.example:8188/prompt")
    assert passed.reply is None


@pytest.mark.parametrize(
    ("path", "headers"),
    [
        ("/scripts/app.js", (("Cache-Control", "no-cache"),)),
        ("/index.json", (("Cache-Control", "no-cache"),)),
        ("/view/x.png", ()),  # images: no header for a 403
        ("/prompt", ()),
    ],
)
def test_the_cache_middleware_wraps_the_refusal(path, headers):
    screening = CHECKING.screen(
        "GET", {"Host": "127.0.0.1:8188", "Origin": "http://evil.example"}, target=path
    )
    assert screening.reply is not None and screening.reply.headers == headers


@pytest.mark.parametrize(
    ("host", "origin"),
    [
        ("127.0.0.1:8188", "http://evil.example:notaport"),
        ("127.0.0.1:notaport", "http://evil.example"),
        ("[::1", "http://evil.example"),
        ("127.0.0.1:8188", "http://[::1"),
    ],
)
def test_what_makes_the_middleware_raise_is_answered_500(host, origin):
    assert origin_verdict(host, origin) is Verdict.ERROR
    screening = CHECKING.screen("POST", {"Host": host, "Origin": origin}, target="/prompt")
    assert screening.reply is not None
    assert screening.reply.status == 500
    assert screening.reply.body == b"500 Internal Server Error\n\nServer got itself in trouble"
    assert screening.reply.content_type == "text/plain; charset=utf-8"
    html = CHECKING.screen(
        "POST", {"Host": host, "Origin": origin, "Accept": "text/html"}, target="/prompt"
    )
    assert html.reply is not None and html.reply.content_type == "text/html; charset=utf-8"


@pytest.mark.parametrize(
    ("host", "origin"),
    [
        ("127.0.0.1:8188", "http://evil.example:8188"),
        ("127.0.0.1:8188", "http://127.0.0.1:8189"),
        ("127.0.0.1:8188", "http://evil.example:notaport"),
    ],
)
def test_with_cors_header_there_is_no_origin_check_and_the_gates_answers_carry_cors(host, origin):
    screening = cors_reading().screen("POST", {"Host": host, "Origin": origin}, target="/prompt")
    assert screening.reply is None
    assert screening.reply_headers == CORS
    assert screening.response_headers == ()  # the runtime adds its own


@pytest.mark.parametrize(
    ("path", "extra"),
    [
        ("/prompt", ()),
        ("/nope", ()),
        ("/scripts/app.js", (("Cache-Control", "no-cache"),)),
        ("/view/x.png", (("Cache-Control", "public, max-age=86400"),)),
    ],
)
def test_with_cors_header_options_is_answered_200_on_any_path(path, extra):
    headers = {"Host": "127.0.0.1:8188", "Origin": "http://evil.example"}
    screening = cors_reading("https://app.example").screen("OPTIONS", headers, target=path)
    assert screening.reply is not None
    reply = screening.reply
    assert (reply.status, reply.body, reply.content_type) == (200, b"", "")
    expected = (("Access-Control-Allow-Origin", "https://app.example"), *CORS[1:], *extra)
    assert reply.headers == expected


@pytest.mark.parametrize(
    ("target", "path"),
    [
        ("/api/prompt?x=1#f", "/api/prompt"),
        ("/a%20b", "/a b"),
        ("http://evil.example/prompt?x", "/prompt"),
        ("", ""),
    ],
)
def test_request_path_is_aiohttps(target, path):
    assert request_path(target) == path


CONFIG = """\
consumers:
  comfyui:
    runtime: {runtime}
    listen: 127.0.0.1:8188
    upstream: http://127.0.0.1:8189
    envelope: 1GiB
    processes: {{names: [python]}}
    cors_header: {value}
"""


@pytest.mark.parametrize(
    ("value", "read"),
    [
        ('"*"', "*"),
        ("https://app.example", "https://app.example"),
        ("http://h:8443", "http://h:8443"),
    ],
)
def test_cors_header_is_read(value, read):
    loaded = load_config_text_with_warnings(
        CONFIG.format(runtime="comfyui", value=value), Path("c.yaml")
    )
    assert loaded.config.consumer("comfyui").settings_as(ComfyUISettings).cors_header == read
    assert loaded.warnings == ()


def test_cors_header_is_absent_by_default():
    text = CONFIG.format(runtime="comfyui", value="x").replace("    cors_header: x\n", "")
    loaded = load_config_text_with_warnings(text, Path("c.yaml"))
    assert loaded.config.consumer("comfyui").settings_as(ComfyUISettings).cors_header is None


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("https://app.example/", "expected '*' or an origin"),
        ("app.example", "expected '*' or an origin"),
        ('"https://a.example, https://b.example"', "expected '*' or an origin"),
        ("true", "expected '*' or an origin like 'https://app.example', got true"),
        ('""', "expected a non-empty string"),
        ("[a]", "got a list"),
    ],
)
def test_a_bad_cors_header_is_reported_with_file_line_and_path(value, message):
    with pytest.raises(ConfigError) as error:
        load_config_text_with_warnings(
            CONFIG.format(runtime="comfyui", value=value), Path("c.yaml")
        )
    assert str(error.value).startswith("c.yaml:8: consumers.comfyui.cors_header: ")
    assert message in str(error.value)


def test_cors_header_on_another_runtime_is_a_warning():
    loaded = load_config_text_with_warnings(
        CONFIG.format(runtime="ollama", value='"*"'), Path("c.yaml")
    )
    assert [str(w) for w in loaded.warnings] == [
        "c.yaml:8: consumers.comfyui.cors_header: warning: only a comfyui consumer reads "
        "cors_header; runtime ollama ignores it"
    ]


@pytest.mark.parametrize("path", ["/free", "/api/free"])
def test_post_free_is_an_unload_the_gate_watches_for_and_leases_nothing_for(path: str) -> None:
    classified = CHECKING.classify("POST", path, None, "application/json")

    assert classified.kind is RouteKind.UNLOAD
    assert classified.model is None and classified.api is ApiFamily.PLAIN


def test_get_free_is_not_an_unload() -> None:
    # ComfyUI routes /free for POST only: a GET is aiohttp's 405, nothing moves.
    assert CHECKING.classify("GET", "/free", None, "").kind is RouteKind.PASS
