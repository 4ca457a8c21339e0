"""Corpus B: what cpp-httplib decides itself, against the real llama-server and whisper-server.

The dialect's server answers each route with the body and headers the real server gave it
(recorded first), so what is compared is what the server adds and decides: refusals, status
lines, its own headers and their order, and whether it closes.
"""

from __future__ import annotations

from gpugate.proxy.dialects.base import RequestHead
from tests.dialects.dialect_server import Answer, Handler
from tests.dialects.harness import Case, complete_answers, exchange

H = b"Host: h\r\n"
ADDED = frozenset(("content-length", "keep-alive", "connection", "accept-ranges", "date"))
"""Headers the server writes itself; a record keeps only the handler's."""


CHUNKED = {
    "plain": b"3\r\nabc\r\n0\r\n\r\n",
    "two": b"3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n",
    "upper hex": b"A\r\n0123456789\r\n0\r\n\r\n",
    "extension": b"3;x=y\r\nabc\r\n0\r\n\r\n",
    "space after size": b"3 \r\nabc\r\n0\r\n\r\n",
    "leading zeros": b"0003\r\nabc\r\n0\r\n\r\n",
    "0x prefix": b"0x3\r\nabc\r\n0\r\n\r\n",
    "negative": b"-3\r\nabc\r\n0\r\n\r\n",
    "junk size": b"zz\r\nabc\r\n0\r\n\r\n",
    "no crlf after data": b"3\r\nabcX\r\n0\r\n\r\n",
    "trailer": b"3\r\nabc\r\n0\r\nX-T: v\r\n\r\n",
    "big": b"1000\r\n" + b"b" * 4096 + b"\r\n0\r\n\r\n",
}


def _get(path: bytes, version: bytes = b"1.1", fields: bytes = H) -> bytes:
    return b"GET " + path + b" HTTP/" + version + b"\r\n" + fields + b"\r\n"


async def record(
    port: int, paths: list[str], defaults: frozenset[str]
) -> dict[tuple[str, str], Answer]:
    """Each path's GET and POST answers from the real server: status, the handler's
    headers, body."""
    records = {}
    for path in paths:
        for method in ("GET", "POST"):
            data = f"{method} {path} HTTP/1.1\r\nHost: h\r\nContent-Length: 0\r\n\r\n"
            outcome = await exchange("127.0.0.1", port, Case(path, data.encode()))
            count, _ = complete_answers(outcome.data)
            assert count == 1, outcome
            head, _, body = outcome.data.partition(b"\r\n\r\n")
            lines = head.decode("latin-1").split("\r\n")
            status = int(lines[0].split(" ")[1])
            fields = [tuple(line.split(": ", 1)) for line in lines[1:]]
            own = [(n, v) for n, v in fields if n.lower() not in ADDED | defaults]
            records[method, path] = Answer(status, own, body)  # type: ignore[arg-type]
    return records


def replay(records: dict[tuple[str, str], Answer], missing: str) -> Handler:
    """A handler answering each recorded path with its record (HEAD as GET), others with
    `missing`'s."""

    def handler(head: RequestHead, body: bytes) -> Answer:
        path = head.target.split("?", 1)[0].split("#", 1)[0]
        method = "POST" if head.method == "POST" else "GET"
        return records.get((method, path), records[method, missing])

    return handler


def corpus(paths: list[str], get_only: list[str], *, whisper: bool) -> list[Case]:
    """Requests on the real routes (`get_only`: routes whose POST answer depends on the
    body, so only read) and requests the server refuses itself."""
    cases: list[Case] = []
    for path in paths:
        p = path.encode()
        cases += [
            Case(f"{path} 1.1", _get(p)),
            Case(f"{path} 1.0", _get(p, b"1.0", b"")),
            Case(f"{path} 1.0 keep-alive", _get(p, b"1.0", b"Connection: keep-alive\r\n")),
            Case(f"{path} 1.0 Keep-Alive", _get(p, b"1.0", b"Connection: Keep-Alive\r\n")),
            Case(f"{path} close", _get(p, b"1.1", H + b"Connection: close\r\n")),
            Case(f"{path} Close", _get(p, b"1.1", H + b"Connection: Close\r\n")),
            Case(f"{path} close list", _get(p, b"1.1", H + b"Connection: foo, close\r\n")),
            Case(f"{path} head", b"HEAD " + p + b" HTTP/1.1\r\n" + H + b"\r\n", head=True),
            Case(f"{path} query", _get(p + b"?a=1&b")),
            Case(f"{path} fragment", _get(p + b"#frag")),
            Case(f"{path} no host", _get(p, b"1.1", b"")),
            Case(f"{path} spaces", b"GET  " + p + b"  HTTP/1.1\r\n" + H + b"\r\n"),
            Case(f"{path} trailing blanks", _get(p, b"1.1", b"Host: h  \t\r\n")),
            Case(f"{path} obs-text", _get(p, b"1.1", H + b"X-O: caf\xe9\r\n")),
            Case(f"{path} empty value", _get(p, b"1.1", H + b"X-E:\r\n")),
            Case(
                f"{path} 99 fields",
                _get(p, b"1.1", b"".join(b"X-%d: v\r\n" % i for i in range(99))),
            ),
            Case(
                f"{path} 100 fields",
                _get(p, b"1.1", b"".join(b"X-%d: v\r\n" % i for i in range(100))),
            ),
            Case(
                f"{path} 101 fields",
                _get(p, b"1.1", b"".join(b"X-%d: v\r\n" % i for i in range(101))),
            ),
            Case(
                f"{path} post cl",
                b"POST " + p + b" HTTP/1.1\r\n" + H + b"Content-Length: 3\r\n\r\nabc",
            ),
            # llama-server sends 100 only from a handler that reads the body: not a miss.
            Case(
                f"{path} expect",
                b"POST "
                + p
                + b" HTTP/1.1\r\n"
                + H
                + b"Expect: 100-continue\r\nContent-Length: 3\r\n\r\nabc",
                answers=2 if whisper else 1,
            ),
        ]
    for path in get_only:
        p = path.encode()
        cases += [
            Case(f"{path} 1.1", _get(p)),
            Case(f"{path} 1.0", _get(p, b"1.0", b"")),
            Case(f"{path} close", _get(p, b"1.1", H + b"Connection: close\r\n")),
            Case(f"{path} head", b"HEAD " + p + b" HTTP/1.1\r\n" + H + b"\r\n", head=True),
        ]
    bad = [
        ("1.2", _get(b"/health", b"1.2")),
        ("2.0", _get(b"/health", b"2.0")),
        ("0.9", b"GET /health\r\n\r\n"),
        ("lowercase method", b"get /health HTTP/1.1\r\n" + H + b"\r\n"),
        ("unknown method", b"FOO /health HTTP/1.1\r\n" + H + b"\r\n"),
        ("four parts", b"GET /health HTTP/1.1 x\r\n" + H + b"\r\n"),
        ("http lowercase", b"GET /health http/1.1\r\n" + H + b"\r\n"),
        ("lf in field", b"GET /health HTTP/1.1\r\nHost: h\nX: y\r\n\r\n"),
        ("folded", b"GET /health HTTP/1.1\r\nHost: h\r\n folded\r\n\r\n"),
        ("space before colon", b"GET /health HTTP/1.1\r\nHost : h\r\n\r\n"),
        ("no colon", b"GET /health HTTP/1.1\r\nHost h\r\n\r\n"),
        ("empty name", b"GET /health HTTP/1.1\r\n: h\r\n\r\n"),
        ("ctl in value", b"GET /health HTTP/1.1\r\nX: a\x01b\r\n\r\n"),
        ("del in value", b"GET /health HTTP/1.1\r\nX: a\x7fb\r\n\r\n"),
        ("nul in value", b"GET /health HTTP/1.1\r\nX: a\x00b\r\n\r\n"),
        ("field 8190", _get(b"/health", b"1.1", b"X: " + b"v" * 8185 + b"\r\n")),
        ("field 8192", _get(b"/health", b"1.1", b"X: " + b"v" * 8187 + b"\r\n")),
        ("field 8193", _get(b"/health", b"1.1", b"X: " + b"v" * 8188 + b"\r\n")),
        ("field 20000", _get(b"/health", b"1.1", b"X: " + b"v" * 20000 + b"\r\n")),
        (
            "cl twice same",
            b"POST /health HTTP/1.1\r\nContent-Length: 3\r\nContent-Length: 3\r\n\r\nabc",
        ),
        (
            "cl twice differ",
            b"POST /health HTTP/1.1\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\nabcd",
        ),
        (
            "cl and te",
            b"POST /health HTTP/1.1\r\nContent-Length: 3\r\nTransfer-Encoding: chunked"
            b"\r\n\r\n3\r\nabc\r\n0\r\n\r\n",
        ),
        (
            "cl 0 and te",
            b"POST /health HTTP/1.1\r\nContent-Length: 0\r\nTransfer-Encoding: chunked"
            b"\r\n\r\n0\r\n\r\n",
        ),
        ("te gzip", b"POST /health HTTP/1.1\r\nTransfer-Encoding: gzip\r\n\r\n"),
        ("te chunked, gzip", b"POST /health HTTP/1.1\r\nTransfer-Encoding: chunked, gzip\r\n\r\n"),
        (
            "te chunked",
            b"POST /health HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n",
        ),
        ("get te chunked", b"GET /health HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n"),
        ("tls hello", b"\x16\x03\x01\x00\xa5\x01\x00\x00\xa1\x03\x03" + b"\x00" * 20 + b"\r\n"),
        ("binary", b"\x00\x01\x02\r\n\r\n"),
        ("empty line", b"\r\nGET /health HTTP/1.1\r\n\r\n"),
        ("unfinished line", b"GET /hea"),
        ("unfinished head", b"GET /health HTTP/1.1\r\nHost: h\r\n"),
    ]
    for name, data in bad:
        # Unfinished requests are half-closed so neither server waits on them.
        unfinished = (
            not data.endswith(b"\r\n\r\n")
            and not data.endswith(b"abc")
            and not data.endswith(b"abcd")
        )
        # whisper-server reads a POST without a length to the close.
        to_close = whisper and name in ("te gzip", "te chunked, gzip")
        cases.append(Case(name, data, half_close=to_close or (unfinished and name != "tls hello")))
    chunked = b"POST /nope HTTP/1.1\r\n" + H + b"Transfer-Encoding: chunked\r\n\r\n"
    for name, body in CHUNKED.items():
        # A negative size wraps to a huge one: whisper-server waits for it to the close.
        cases.append(Case(f"chunked {name}", chunked + body, half_close=name == "negative"))
    post = b"POST /nope HTTP/1.1\r\n" + H + b"\r\n"
    cases.append(Case("post no length", post, half_close=whisper))
    get = b"GET /health HTTP/1.1\r\n" + H + b"Content-Length: 3\r\n\r\nabc"
    cases.append(Case("get with body", get))
    if not whisper:
        # 0.20 answers a long target only after a second header block: no answer to wait for.
        for size in (8192, 8193, 9000, 32753, 32754, 40000):
            cases.append(Case(f"target {size}", _get(b"/health?" + b"a" * (size - 8))))
    return cases
