"""Corpus U: raw requests that probe what uvicorn's httptools protocol decides itself.

The aiohttp corpus's cases (both servers read with llhttp, under other settings and other
answers) less the upgrades uvicorn hands on or stops reading after (a websocket, `h2c`,
`CONNECT`: proxy/dialects/uvicorn.py "Not modelled"), and cases of uvicorn's own rules:
HTTP/1.0 never kept, `Expect` on any version and without a body, data after a
`Connection: close`, a target `parse_url` refuses or whose path is not ASCII, no head limit.
"""

from __future__ import annotations

from tests.dialects import corpus_aiohttp
from tests.dialects.harness import Case

H = b"Host: h\r\n"
GET = b"GET /a HTTP/1.1\r\n" + H + b"\r\n"
UNMODELLED = ("upgrade websocket", "upgrade h2c", "connect")
"""corpus_aiohttp cases whose upgrade uvicorn takes or stops reading after."""


def _shared() -> list[Case]:
    cases = []
    for case in corpus_aiohttp.corpus():
        if case.name in UNMODELLED or b"CONNECT " in case.data:
            continue
        # uvicorn invites an HTTP/1.0 body too: two answers, where aiohttp gives one
        answers = 2 if case.name == "expect 100 on 1.0" else case.answers
        cases.append(Case("aiohttp " + case.name, case.data, answers, case.half_close, case.head))
    return cases


def _post(head: bytes, body: bytes = b"", version: bytes = b"1.1") -> bytes:
    return b"POST /e HTTP/" + version + b"\r\n" + H + head + b"\r\n" + body


def _own() -> list[Case]:
    cont = b"Expect: 100-continue\r\n"
    length = b"Content-Length: 3\r\n"
    chunked = b"Transfer-Encoding: chunked\r\n"
    close = b"Connection: close\r\n"
    keep = b"Connection: keep-alive\r\n"
    cases = [
        Case("1.0 keep-alive closes", b"GET / HTTP/1.0\r\n" + keep + b"\r\n"),
        Case("1.0 keep-alive pipelined", b"GET / HTTP/1.0\r\n" + keep + b"\r\n" + GET),
        Case("2.0 keep-alive kept", b"GET / HTTP/2.0\r\n" + keep + b"\r\n" + GET, answers=2),
        Case("2.0 closes", b"GET / HTTP/2.0\r\n\r\n" + GET),
        Case("0.9 keep-alive kept", b"GET / HTTP/0.9\r\n" + keep + b"\r\n" + GET, answers=2),
        Case("0.9 line then get", b"GET /v\r\n" + GET),
        Case("0.9 line only", b"GET /v\r\n", half_close=True),
        Case("0.9 line fields", b"GET /v\r\nX: y\r\n\r\n"),
        Case("0.9 line post", b"POST /v\r\n\r\n"),
        Case("close then junk", b"GET / HTTP/1.1\r\n" + H + close + b"\r\nJUNK\r\n\r\n"),
        Case("close then get", b"GET / HTTP/1.1\r\n" + H + close + b"\r\n" + GET),
        Case("1.0 then junk", b"GET / HTTP/1.0\r\n\r\nJUNK"),
        Case("expect get no body", b"GET /x HTTP/1.1\r\n" + H + cont + b"\r\n", answers=2),
        Case("expect 1.0", _post(cont + length, b"abc", b"1.0"), answers=2),
        Case("expect trailing blanks", _post(b"Expect: 100-continue  \r\n" + length, b"abc"), 2),
        Case("expect list", _post(b"Expect: 100-continue, foo\r\n" + length, b"abc")),
        Case("expect twice", _post(b"Expect: foo\r\n" + cont + length, b"abc"), answers=2),
        Case("expect other", _post(b"Expect: 200-ok\r\n" + length, b"abc")),
        Case("expect chunked", _post(cont + chunked, b"3\r\nabc\r\n0\r\n\r\n"), answers=2),
        Case("asterisk get", b"GET * HTTP/1.1\r\n" + H + b"\r\n"),
        Case("authority get", b"GET h:80 HTTP/1.1\r\n" + H + b"\r\n"),
        Case("absolute query", b"GET http://h/x?a=1&b HTTP/1.1\r\n" + H + b"\r\n"),
        Case("percent path", b"GET /a%20b%2F?x=%41 HTTP/1.1\r\n" + H + b"\r\n"),
        Case("fragment", b"GET /a#frag HTTP/1.1\r\n" + H + b"\r\n"),
        Case("non-ascii path", b"GET /caf\xc3\xa9 HTTP/1.1\r\n" + H + b"\r\n"),
        Case("non-ascii query", b"GET /q?caf\xc3\xa9 HTTP/1.1\r\n" + H + b"\r\n"),
        Case("bad second target", GET + b"GET h:80 HTTP/1.1\r\n" + H + b"\r\n"),
        Case("asterisk second", GET + b"GET * HTTP/1.1\r\n" + H + b"\r\n", answers=2),
        Case("no host 1.1", b"GET / HTTP/1.1\r\n\r\n"),
        Case("head", b"HEAD /h HTTP/1.1\r\n" + H + b"\r\n", head=True),
        Case("propfind", b"PROPFIND /p HTTP/1.1\r\n" + H + b"\r\n"),
        Case("patch body", b"PATCH /p HTTP/1.1\r\n" + H + length + b"\r\nabc"),
        Case("get with body", b"GET /g HTTP/1.1\r\n" + H + length + b"\r\nabc"),
        Case("1.0 chunked", _post(chunked, b"3\r\nabc\r\n0\r\n\r\n", b"1.0")),
        Case(
            "1.0 gzip chunked", _post(b"Transfer-Encoding: gzip, chunked\r\n", b"0\r\n\r\n", b"1.0")
        ),
        Case("content-encoding gzip", _post(b"Content-Encoding: gzip\r\n" + length, b"abc")),
        Case("pipelined 5", GET * 5, answers=5),
        Case("pipelined post get", _post(length, b"abc") + GET, answers=2),
        Case("pipelined then junk", GET + GET + b"JUNK\r\n\r\n"),
        Case("pipelined then 1.2", GET + b"GET / HTTP/1.2\r\n\r\n"),
        Case("boom then get", b"GET /boom HTTP/1.1\r\n" + H + b"\r\n" + GET),
        Case("boom 1.0", b"GET /boom HTTP/1.0\r\n\r\n"),
        Case("chunk then bad chunk", _post(chunked, b"3\r\nabc\r\nzz\r\n")),
        Case("chunk ext bad", _post(chunked, b"3;=\r\nabc\r\n0\r\n\r\n")),
        Case("chunk then get", _post(chunked, b"1\r\na\r\n0\r\n\r\n") + GET, answers=2),
        Case("space in name", b"GET / HTTP/1.1\r\n" + H + b"X Y: v\r\n\r\n"),
        Case("tab in value", b"GET / HTTP/1.1\r\n" + H + b"X-T: a\tb\t\r\n\r\n"),
        Case("leading blanks", b"GET / HTTP/1.1\r\n" + H + b"X-L: \t v\r\n\r\n"),
        Case("leading lf", b"\nGET / HTTP/1.1\r\n" + H + b"\r\n"),
        Case("many crlf first", b"\r\n\r\n\r\nGET / HTTP/1.1\r\n" + H + b"\r\n"),
    ]
    for size in (64_000, 200_000):
        big = b"GET / HTTP/1.1\r\n" + H + b"Cookie: " + b"c" * size + b"\r\n\r\n"
        cases.append(Case(f"header {size}", big))
    fields = b"".join(b"X-%d: %d\r\n" % (i, i) for i in range(1000))
    cases.append(Case("1000 fields", b"GET / HTTP/1.1\r\n" + H + fields + b"\r\n"))
    return cases


def corpus() -> list[Case]:
    """Every case, names unique."""
    cases = _shared() + _own()
    assert len({case.name for case in cases}) == len(cases)
    return cases
