"""Ollama v0.24.0's CORS and Host checks at the gate, case by case from the source.

Expected answers are written from gin-contrib/cors v1.7.2 (config.go `applyCors`,
`validateOrigin`, `validateWildcardOrigin`; cors.go `parseWildcardRules`, `Validate`;
utils.go `generatePreflightHeaders`, `normalize`), Ollama's `GenerateRoutes`,
`allowedHostsMiddleware` and `envconfig.AllowedOrigins`, gin v1.10.0's 405 handling and
Go's `url.ParseRequestURI`, not from the gate's own code.
"""

from __future__ import annotations

import pytest

from gpugate.runtimes.ollama.gotarget import BadTarget, parse_target
from gpugate.runtimes.ollama.host import (
    BAD_REQUEST,
    OllamaHostCheck,
    OriginRules,
    allow_header,
    ollama_origins,
    origin_problem,
)

HOST = "localhost:11434"
PREFLIGHT_HEADERS = (
    "Authorization,Content-Type,User-Agent,Accept,X-Requested-With,Openai-Beta,"
    "X-Stainless-Arch,X-Stainless-Async,X-Stainless-Custom-Poll-Interval,"
    "X-Stainless-Helper-Method,X-Stainless-Lang,X-Stainless-Os,X-Stainless-Package-Version,"
    "X-Stainless-Poll-Helper,X-Stainless-Retry-Count,X-Stainless-Runtime,"
    "X-Stainless-Runtime-Version,X-Stainless-Timeout"
)

REFUSED = [
    # Each merely starts with an allowed origin's text; v1.7.2's `http://localhost:*` is
    # the prefix "http://localhost:" (with the colon), so none of these matches.
    "http://localhostevil.example",
    "http://localhost.evil.example",
    "http://127.0.0.1.evil.example",
    "http://localhost@evil.example",
    "http://localhost, http://evil.example",
    "https://localhost.evil.example",
    "http://0.0.0.0.evil.example",
    "https://127.0.0.1evil.example",
    "http://127.0.0.1@evil.example:80",
    "http://evil.example",
    "null",
    # Exact entries are lower-cased, the request's Origin is not (config.go 129-133).
    "HTTP://LOCALHOST",
    "http://LOCALHOST:3000",
    # Not in Ollama's list: AllowBrowserExtensions only lets such entries be configured.
    "chrome-extension://abcdefghijklmnop",
    "ws://localhost:3000",
]
ALLOWED = [
    "http://localhost",
    "http://localhost:3000",
    "https://localhost:8443",
    "https://127.0.0.1",
    "http://127.0.0.1:5173",
    "http://0.0.0.0:8080",
    # "http://localhost:*" is the prefix "http://localhost:" with any suffix.
    "http://localhost:",
    "http://localhost:3000.evil.example",
    "app://x",
    "file://",
    "tauri://localhost",
    "vscode-webview://abc",
    "vscode-file://vscode-app",
]
METHODS = [
    ("GET", "/api/tags", ""),
    ("POST", "/api/generate", ""),
    ("OPTIONS", "/api/chat", "POST"),
]


def preflight(origin: str, allow: str) -> tuple[tuple[str, str], ...]:
    """handlePreflight's headers, the origin, gin's Allow; in net/http's (sorted) order."""
    headers = [
        ("Access-Control-Allow-Headers", PREFLIGHT_HEADERS),
        ("Access-Control-Allow-Methods", "GET,POST,PUT,PATCH,DELETE,HEAD,OPTIONS"),
        ("Access-Control-Allow-Origin", origin),
        ("Access-Control-Max-Age", "43200"),
    ]
    if allow:
        headers.append(("Allow", allow))
    headers += [
        ("Vary", "Origin"),
        ("Vary", "Access-Control-Request-Method"),
        ("Vary", "Access-Control-Request-Headers"),
    ]
    return tuple(headers)


@pytest.mark.parametrize("listen", ["127.0.0.1", "0.0.0.0"])
@pytest.mark.parametrize(("method", "path", "allow"), METHODS)
@pytest.mark.parametrize("origin", REFUSED)
def test_an_origin_ollama_refuses_is_refused_with_its_empty_403(
    listen, method, path, allow, origin
):
    check = OllamaHostCheck(listen)
    screening = check.screen(method, {"Host": HOST, "Origin": origin}, target=path)
    assert screening.reply is not None
    assert (screening.reply.status, screening.reply.body, screening.reply.content_type) == (
        403,
        b"",
        "",
    )
    # gin set Allow before the middleware aborted: only where the path is another method's.
    assert screening.reply.headers == ((("Allow", allow),) if allow else ())
    assert "Origin" in screening.drop_up


@pytest.mark.parametrize("listen", ["127.0.0.1", "0.0.0.0"])
@pytest.mark.parametrize(("method", "path", "allow"), METHODS)
@pytest.mark.parametrize("origin", ALLOWED)
def test_an_origin_ollama_allows_passes_or_gets_its_preflight(listen, method, path, allow, origin):
    check = OllamaHostCheck(listen)
    screening = check.screen(method, {"Host": HOST, "Origin": origin}, target=path)
    if method == "OPTIONS":
        assert screening.reply is not None
        assert (screening.reply.status, screening.reply.body) == (204, b"")
        assert screening.reply.headers == preflight(origin, allow)
        return
    assert screening.reply is None
    cors = (("Access-Control-Allow-Origin", origin), ("Vary", "Origin"))
    assert screening.response_headers == cors
    # The gate's own answers (503, 502, 504) carry what gin had set before the handler.
    assert screening.reply_headers == cors


def test_a_browser_extension_is_allowed_once_configured():
    check = OllamaHostCheck("127.0.0.1", ("chrome-extension://*",))
    origin = "chrome-extension://abcdefghijklmnop"
    headers = {"Host": HOST, "Origin": origin}
    assert check.screen("GET", headers, target="/api/tags").reply is None
    answer = check.screen("OPTIONS", headers, target="/api/chat").reply
    assert answer is not None and answer.headers == preflight(origin, "POST")
    assert check.screen("GET", {"Host": HOST, "Origin": "moz-extension://x"}).reply is not None


@pytest.mark.parametrize(
    ("extra", "origin", "allowed"),
    [
        (("https://app.example.com",), "https://app.example.com", True),
        # Exact entries are trimmed and lower-cased; the Origin is compared as sent.
        (("https://App.Example.com",), "https://app.example.com", True),
        (("https://b.example ,https://c.example",), "https://b.example", True),
        # Validate checks the scheme as written: an upper-case or spaced one panics.
        (("HTTPS://app.example.com",), "https://app.example.com", False),
        (("https://c.example, https://b.example",), "https://b.example", False),
        (("https://app.example.com",), "https://APP.example.com", False),
        # A star in the middle: prefix and suffix as written (not lower-cased).
        (("https://*.example.com",), "https://a.b.example.com", True),
        (("https://*.example.com",), "https://example.com", False),
        (("https://*.Example.com",), "https://a.example.com", False),
        (("*.example.com",), "https://evil.example.com", True),
        (("https://app.*",), "https://app.evil", True),
        # OLLAMA_ORIGINS is split at commas.
        (("https://a.example,https://b.example",), "https://b.example", True),
        # An entry cors.New panics on (Ollama would not start) allows nothing.
        (("app.example.com",), "app.example.com", False),
        (("https://*.*.example",), "https://a.b.example", False),
        (("*",), "https://anything.example", True),
    ],
)
def test_ollama_origins_entries(extra, origin, allowed):
    assert OriginRules.build(extra).allowed(origin) is allowed


def test_origins_env_is_trimmed_and_split_as_envconfig_does():
    assert ollama_origins(('"https://a.example', 'https://b.example"'))[:2] == (
        "https://a.example",
        "https://b.example",
    )
    assert ollama_origins(())[:4] == (
        "http://localhost",
        "https://localhost",
        "http://localhost:*",
        "https://localhost:*",
    )


def test_origin_problem_names_what_cors_new_panics_on():
    assert origin_problem("https://ok.example") is None
    assert origin_problem("chrome-extension://id") is None
    assert origin_problem("*.example") is None
    assert "only one *" in (origin_problem("https://*.*") or "")
    assert origin_problem("app.example") is not None
    assert origin_problem(" https://leading.space") is not None


def test_allow_all_answers_a_star_and_no_vary():
    check = OllamaHostCheck("127.0.0.1", ("*",))
    screening = check.screen("GET", {"Host": HOST, "Origin": "https://x.example"})
    assert screening.reply is None
    assert screening.response_headers == (("Access-Control-Allow-Origin", "*"),)
    answer = check.screen("OPTIONS", {"Host": HOST, "Origin": "https://x.example"}).reply
    assert answer is not None
    assert answer.headers == (
        ("Access-Control-Allow-Headers", PREFLIGHT_HEADERS),
        ("Access-Control-Allow-Methods", "GET,POST,PUT,PATCH,DELETE,HEAD,OPTIONS"),
        ("Access-Control-Allow-Origin", "*"),
        ("Access-Control-Max-Age", "43200"),
    )


@pytest.mark.parametrize(
    ("method", "path", "allow"),
    [
        ("OPTIONS", "/api/tags", "HEAD, GET"),
        ("OPTIONS", "/", "HEAD, GET"),
        ("OPTIONS", "/api/blobs/sha256-1", "HEAD, POST"),
        ("OPTIONS", "/api/user/keys/abc", "DELETE"),
        ("OPTIONS", "/v1/models/llama3", "GET"),
        ("OPTIONS", "/v1/chat/completions", "POST"),
        ("OPTIONS", "/nope", ""),
        ("OPTIONS", "/api/tags/", ""),
        ("POST", "/api/tags", "HEAD, GET"),
        ("GET", "/api/tags", ""),
        ("GET", "/api/generate", "POST"),
        ("DELETE", "/api/blobs/x", "HEAD, POST"),
    ],
)
def test_allow_lists_the_other_trees_in_ollamas_registration_order(method, path, allow):
    assert allow_header(method, path) == allow


def test_host_check_after_cors_keeps_the_cors_headers_and_the_allow():
    check = OllamaHostCheck("127.0.0.1")
    screening = check.screen(
        "POST", {"Host": "evil.example", "Origin": "http://localhost:3000"}, target="/api/tags"
    )
    assert screening.reply is not None and screening.reply.status == 403
    assert screening.reply.headers == (
        ("Access-Control-Allow-Origin", "http://localhost:3000"),
        ("Allow", "HEAD, GET"),
        ("Vary", "Origin"),
    )


def test_an_options_to_an_allowed_host_name_is_answered_204_with_allow():
    check = OllamaHostCheck("127.0.0.1")
    answer = check.screen("OPTIONS", {"Host": HOST}, target="/api/tags").reply
    assert answer is not None
    assert (answer.status, answer.body, answer.headers) == (204, b"", (("Allow", "HEAD, GET"),))
    # An IP host goes on to gin's 405, which the runtime itself answers.
    assert check.screen("OPTIONS", {"Host": "127.0.0.1:11434"}, target="/api/tags").reply is None


@pytest.mark.parametrize(
    ("target", "header", "refused"),
    [
        # net/http: `req.Host = req.URL.Host`; the Host header only when that is empty.
        ("http://evil.example/api/tags", "localhost", True),
        ("http://evil.example:11434/api/tags", "localhost:11434", True),
        ("http://localhost@evil.example/api/tags", "localhost", True),
        ("HTTP://evil.example/api/tags", "localhost", True),
        ("foo://evil.example/api/tags", "localhost", True),
        ("http://localhost:11434/api/tags", "evil.example", False),
        ("http://127.0.0.1/api/tags", "evil.example", False),
        ("http://[::1]:11434/api/tags", "evil.example", False),
        ("http://10.1.2.3/api/tags", "evil.example", False),
        ("/api/tags", "evil.example", True),
        ("/api/tags", "localhost", False),
        # No authority: the Host header decides.
        ("http:/api/tags", "localhost", False),
    ],
)
def test_the_host_is_the_one_go_takes_from_the_request_line(target, header, refused):
    check = OllamaHostCheck("127.0.0.1")
    screening = check.screen("GET", {"Host": header}, target=target)
    if refused:
        assert screening.reply is not None
        assert (screening.reply.status, screening.reply.body) == (403, b"")
    else:
        assert screening.reply is None


def test_same_origin_is_judged_against_the_absolute_forms_host():
    check = OllamaHostCheck("0.0.0.0")
    # Origin equals http://<Request.Host>: not a CORS request at all.
    same = check.screen(
        "GET", {"Host": "x", "Origin": "http://gpu.example:11434"},
        target="http://gpu.example:11434/api/tags",
    )  # fmt: skip
    assert same.reply is None and same.response_headers == ()
    # The Host header alone would have made it same-origin; Go does not look at it.
    cross = check.screen(
        "GET", {"Host": "gpu.example:11434", "Origin": "http://gpu.example:11434"},
        target="http://other.example/api/tags",
    )  # fmt: skip
    assert cross.reply is not None and cross.reply.status == 403


@pytest.mark.parametrize(
    ("target", "host", "path"),
    [
        ("/api/tags?x=1", "", "/api/tags"),
        ("/api/t%61gs", "", "/api/tags"),
        ("http://a.example:1/p/q?x", "a.example:1", "/p/q"),
        ("http://u:p@a.example/p", "a.example", "/p"),
        ("http://a.example", "a.example", ""),
        ("http:opaque", "", ""),
        ("*", "", "*"),
        ("http://%C3%A9.example/p", "\u00e9.example", "/p"),
        # Go 1.26.0 drops what comes before the last "[" (1.26.6 and 1.27 refuse it)
        ("http://evil.example[::1]:11434/p", "[::1]:11434", "/p"),
    ],
)
def test_parse_target_as_go_parses_a_request_uri(target, host, path):
    parsed = parse_target(target)
    assert (parsed.host, parsed.path) == (host, path)


@pytest.mark.parametrize(
    "target",
    [
        "api/tags",  # no scheme, not a path
        ":/x",  # missing protocol scheme
        "http://a.example:port/x",  # the port is not digits
        "http://a b.example/x",  # a space in the host
        "http://a%2Eexample/x",  # %-escapes in a host stand for non-ASCII only
        "/api/t%zzgs",  # a broken escape in the path
        "http://[::1/x",  # missing ']'
        "http://us er@a.example/x",  # bad userinfo
    ],
)
def test_a_target_go_cannot_parse_is_answered_400(target):
    with pytest.raises(BadTarget):
        parse_target(target)
    screening = OllamaHostCheck("127.0.0.1").screen("GET", {"Host": HOST}, target=target)
    assert screening.reply == BAD_REQUEST
