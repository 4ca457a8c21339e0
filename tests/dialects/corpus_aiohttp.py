"""Corpus A: raw requests that probe what aiohttp's server decides itself."""

from __future__ import annotations

from tests.dialects.harness import Case

H = b"Host: h\r\n"
CHUNKED_SERVED = ("te chunked", "te Chunked", "te gzip, chunked", "te chunked space")
"""Framings read as chunked: a body of "abc" is a chunk size, and the server waits on."""


def _versions() -> list[Case]:
    cases = []
    versions = [
        b"HTTP/1.1",
        b"HTTP/1.0",
        b"HTTP/1.2",
        b"HTTP/2.0",
        b"HTTP/2",
        b"HTTP/3.0",
        b"HTTP/0.9",
        b"HTTP/1.10",
        b"HTTP/01.1",
        b"http/1.1",
        b"HTTP/1",
        b"HTTP/9.9",
        b"HTTP/1.1 ",
        b"HTTP/1.x",
        b"HTTPS/1.1",
        b"ICE/1.0",
    ]
    for version in versions:
        for method in (b"GET", b"POST", b"get", b"PRI", b"OPTIONS", b"DELETE", b"X-CUSTOM"):
            for host in (H, b""):
                if method == b"PRI" and not host:
                    continue  # waits for the HTTP/2 preface's second part
                data = method + b" /v?q=1 " + version + b"\r\n" + host + b"\r\n"
                cases.append(Case(f"version {version!r} {method!r} host={bool(host)}", data))
    cases.append(Case("http/0.9 no version", b"GET /v\r\n\r\n"))
    cases.append(Case("no target", b"GET HTTP/1.1\r\nHost: h\r\n\r\n"))
    cases.append(Case("two spaces", b"GET  / HTTP/1.1\r\nHost: h\r\n\r\n"))
    cases.append(Case("tab separator", b"GET\t/ HTTP/1.1\r\nHost: h\r\n\r\n"))
    cases.append(Case("absolute target", b"GET http://h/x HTTP/1.1\r\nHost: h\r\n\r\n"))
    cases.append(Case("asterisk", b"OPTIONS * HTTP/1.1\r\nHost: h\r\n\r\n"))
    cases.append(Case("connect", b"CONNECT h:80 HTTP/1.1\r\nHost: h:80\r\n\r\n"))
    cases.append(Case("head", b"HEAD /x HTTP/1.1\r\nHost: h\r\n\r\n", head=True))
    cases.append(Case("non-ascii target", b"GET /\xc3\xa9 HTTP/1.1\r\nHost: h\r\n\r\n"))
    cases.append(Case("ctl in target", b"GET /a\x01b HTTP/1.1\r\nHost: h\r\n\r\n"))
    cases.append(Case("leading crlf", b"\r\nGET / HTTP/1.1\r\nHost: h\r\n\r\n"))
    return cases


def _sizes() -> list[Case]:
    cases = []
    for size in (4000, 8150, 8170, 8175, 8180, 8186, 8187, 8190, 8191, 8200, 9000, 70000):
        target = b"/" + b"a" * (size - 1)
        cases.append(Case(f"target {size}", b"GET " + target + b" HTTP/1.1\r\n" + H + b"\r\n"))
        value = b"v" * size
        cases.append(
            Case(f"value {size}", b"GET / HTTP/1.1\r\n" + H + b"X-Big: " + value + b"\r\n\r\n")
        )
        name = b"N" * size
        cases.append(Case(f"name {size}", b"GET / HTTP/1.1\r\n" + H + name + b": v\r\n\r\n"))
    for count in (100, 126, 127, 128, 129, 200):
        fields = b"".join(b"X-%d: %d\r\n" % (i, i) for i in range(count))
        cases.append(Case(f"{count} fields+host", b"GET / HTTP/1.1\r\n" + H + fields + b"\r\n"))
    for total in (60, 200):
        fields = b"".join(b"X-%d: %s\r\n" % (i, b"c" * 4000) for i in range(total))
        cases.append(Case(f"{total} fields of 4000", b"GET / HTTP/1.1\r\n" + H + fields + b"\r\n"))
    return cases


def _lines() -> list[Case]:
    return [
        Case("lf only", b"GET / HTTP/1.1\nHost: h\n\n"),
        Case("lf after request line", b"GET / HTTP/1.1\nHost: h\r\n\r\n"),
        Case("lf after field", b"GET / HTTP/1.1\r\nHost: h\n\r\n"),
        Case("lf final", b"GET / HTTP/1.1\r\nHost: h\r\n\n"),
        Case("cr only", b"GET / HTTP/1.1\rHost: h\r\r"),
        Case("folded", b"GET / HTTP/1.1\r\nHost: h\r\nX-F: a\r\n b\r\n\r\n"),
        Case("folded tab", b"GET / HTTP/1.1\r\nHost: h\r\nX-F: a\r\n\tb\r\n\r\n"),
        Case("first field folded", b"GET / HTTP/1.1\r\n folded\r\nHost: h\r\n\r\n"),
        Case("space before colon", b"GET / HTTP/1.1\r\nHost: h\r\nX-A : v\r\n\r\n"),
        Case("no colon", b"GET / HTTP/1.1\r\nHost: h\r\nnocolon\r\n\r\n"),
        Case("empty name", b"GET / HTTP/1.1\r\nHost: h\r\n: v\r\n\r\n"),
        Case("empty value", b"GET / HTTP/1.1\r\nHost: h\r\nX-E:\r\n\r\n"),
        Case("nul in value", b"GET / HTTP/1.1\r\nHost: h\r\nX-N: a\x00b\r\n\r\n"),
        Case("obs-text value", b"GET / HTTP/1.1\r\nHost: h\r\nX-O: caf\xe9\r\n\r\n"),
        Case("utf8 value", b"GET / HTTP/1.1\r\nHost: h\r\nX-U: \xc3\xa9\r\n\r\n"),
        Case("ctl in value", b"GET / HTTP/1.1\r\nHost: h\r\nX-C: a\x01b\r\n\r\n"),
        Case("del in value", b"GET / HTTP/1.1\r\nHost: h\r\nX-D: a\x7fb\r\n\r\n"),
        Case("trailing spaces", b"GET / HTTP/1.1\r\nHost: h\r\nX-S:   v   \r\n\r\n"),
        Case("name with slash", b"GET / HTTP/1.1\r\nHost: h\r\nX/Y: v\r\n\r\n"),
        Case("name utf8", b"GET / HTTP/1.1\r\nHost: h\r\nX\xc3\xa9: v\r\n\r\n"),
        Case("two hosts", b"GET / HTTP/1.1\r\nHost: h\r\nHost: i\r\n\r\n"),
        Case("host with space", b"GET / HTTP/1.1\r\nHost: a b\r\n\r\n"),
        Case("empty host", b"GET / HTTP/1.1\r\nHost:\r\n\r\n"),
        Case("mixed case names", b"GET / HTTP/1.1\r\nhOsT: h\r\ncontent-TYPE: x\r\n\r\n"),
        Case("connection close", b"GET / HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n"),
        Case("connection keep-alive 1.0", b"GET / HTTP/1.0\r\nConnection: keep-alive\r\n\r\n"),
        Case("connection upgrade", b"GET / HTTP/1.1\r\nHost: h\r\nConnection: Upgrade\r\n\r\n"),
        Case("connection list", b"GET / HTTP/1.1\r\nHost: h\r\nConnection: foo, close\r\n\r\n"),
        Case("connection CLOSE", b"GET / HTTP/1.1\r\nHost: h\r\nConnection: CLOSE\r\n\r\n"),
        Case(
            "keep-alive 1.0 twice",
            b"GET / HTTP/1.0\r\nConnection: keep-alive\r\n\r\n" * 2,
            answers=2,
        ),
    ]


def _framing() -> list[Case]:
    cases = []
    fields = {
        "cl": b"Content-Length: 3\r\n",
        "cl0": b"Content-Length: 0\r\n",
        "cl twice same": b"Content-Length: 3\r\nContent-Length: 3\r\n",
        "cl twice differ": b"Content-Length: 3\r\nContent-Length: 4\r\n",
        "cl list": b"Content-Length: 3, 3\r\n",
        "cl plus": b"Content-Length: +3\r\n",
        "cl negative": b"Content-Length: -3\r\n",
        "cl spaces": b"Content-Length:  3 \r\n",
        "cl hex": b"Content-Length: 0x3\r\n",
        "cl empty": b"Content-Length:\r\n",
        "cl huge": b"Content-Length: 99999999999999999999999\r\n",
        "te chunked": b"Transfer-Encoding: chunked\r\n",
        "te Chunked": b"Transfer-Encoding: Chunked\r\n",
        "te chunked+cl": b"Transfer-Encoding: chunked\r\nContent-Length: 3\r\n",
        "cl+te chunked": b"Content-Length: 3\r\nTransfer-Encoding: chunked\r\n",
        "te gzip": b"Transfer-Encoding: gzip\r\n",
        "te gzip, chunked": b"Transfer-Encoding: gzip, chunked\r\n",
        "te chunked, gzip": b"Transfer-Encoding: chunked, gzip\r\n",
        "te twice": b"Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n",
        "te identity": b"Transfer-Encoding: identity\r\n",
        "te empty": b"Transfer-Encoding:\r\n",
        "te chunked space": b"Transfer-Encoding:  chunked \r\n",
    }
    bodies = {"none": b"", "abc": b"abc", "chunk": b"3\r\nabc\r\n0\r\n\r\n"}
    for version in (b"1.1", b"1.0"):
        for method in (b"POST", b"GET"):
            for fname, field in fields.items():
                for bname, body in bodies.items():
                    data = method + b" /f HTTP/" + version + b"\r\n" + H + field + b"\r\n" + body
                    # A body not sent is waited for: the unfinished cases cover that.
                    chunked = b"chunked" in field.lower()
                    if bname == "none" and (chunked or fname == "cl"):
                        continue
                    # "abc" read as a chunk size, or a length not sent: the client leaves.
                    waits = (bname == "abc" and fname in CHUNKED_SERVED) or (
                        bname == "none" and fname == "cl spaces"
                    )
                    name = f"{method!r} {version!r} {fname} body={bname}"
                    cases.append(Case(name, data, half_close=waits))
    return cases


def _chunked() -> list[Case]:
    bodies = {
        "plain": b"3\r\nabc\r\n0\r\n\r\n",
        "two": b"3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n",
        "upper hex": b"A\r\n0123456789\r\n0\r\n\r\n",
        "lower hex": b"a\r\n0123456789\r\n0\r\n\r\n",
        "extension": b"3;x=y\r\nabc\r\n0\r\n\r\n",
        "extension quoted": b'3;x="y z"\r\nabc\r\n0\r\n\r\n',
        "extension bare": b"3;x\r\nabc\r\n0\r\n\r\n",
        "space after size": b"3 \r\nabc\r\n0\r\n\r\n",
        "space before ext": b"3 ;x=y\r\nabc\r\n0\r\n\r\n",
        "leading zeros": b"0003\r\nabc\r\n0\r\n\r\n",
        "0x prefix": b"0x3\r\nabc\r\n0\r\n\r\n",
        "negative": b"-3\r\nabc\r\n0\r\n\r\n",
        "plus": b"+3\r\nabc\r\n0\r\n\r\n",
        "overflow": b"fffffffffffffffff\r\nabc\r\n0\r\n\r\n",
        "16 digits": b"000000000000003\r\nabc\r\n0\r\n\r\n",
        "no crlf after data": b"3\r\nabcX\r\n0\r\n\r\n",
        "lf after data": b"3\r\nabc\n0\r\n\r\n",
        "lf after size": b"3\nabc\r\n0\r\n\r\n",
        "lf final": b"3\r\nabc\r\n0\r\n\n",
        "trailer": b"3\r\nabc\r\n0\r\nX-T: v\r\n\r\n",
        "trailer bad": b"3\r\nabc\r\n0\r\nbad trailer\r\n\r\n",
        "trailer lf": b"3\r\nabc\r\n0\r\nX-T: v\n\r\n",
        "empty size": b"\r\nabc\r\n0\r\n\r\n",
        "junk size": b"zz\r\nabc\r\n0\r\n\r\n",
        "zero only": b"0\r\n\r\n",
        "big chunk": b"1000\r\n" + b"b" * 4096 + b"\r\n0\r\n\r\n",
        "then junk": b"3\r\nabc\r\n0\r\n\r\nJUNK",
        "then request": b"3\r\nabc\r\n0\r\n\r\nGET /next HTTP/1.1\r\nHost: h\r\n\r\n",
    }
    cases = []
    for name, body in bodies.items():
        data = b"POST /c HTTP/1.1\r\n" + H + b"Transfer-Encoding: chunked\r\n\r\n" + body
        answers = 2 if name == "then request" else 1
        cases.append(Case(f"chunked {name}", data, answers=answers))
    return cases


def _post(head: bytes, body: bytes = b"", version: bytes = b"1.1") -> bytes:
    host = H if version == b"1.1" else b""
    return b"POST /e HTTP/" + version + b"\r\n" + host + head + b"\r\n" + body


def _streams() -> list[Case]:
    get = b"GET /a HTTP/1.1\r\n" + H + b"\r\n"
    post = _post(b"Content-Length: 3\r\n", b"abc")
    cont = b"Expect: 100-continue\r\n"
    length = b"Content-Length: 3\r\n"
    chunked = b"Transfer-Encoding: chunked\r\n"
    upgrade = b"Connection: Upgrade\r\nUpgrade: "
    return [
        Case("junk after get", get + b"JUNK\r\n\r\n"),
        Case("junk line after get", get + b"hello\r\n"),
        Case("crlf after get", get + b"\r\n"),
        Case("crlf crlf after get", get + b"\r\n\r\n", answers=1),
        Case("junk after post", post + b"JUNK"),
        Case("extra body bytes", post + b"de"),
        Case("pipelined 2", get + get, answers=2),
        Case("pipelined 3", get + post + get, answers=3),
        Case("pipelined 1.0", b"GET / HTTP/1.0\r\n\r\n" + get, answers=1),
        Case("pipelined close", b"GET / HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n" + get),
        Case("pipelined bad second", get + b"GET / HTTP/1.2\r\n\r\n", answers=2),
        Case("expect 100", _post(cont + length, b"abc"), answers=2),
        Case("expect 100 upper", _post(b"Expect: 100-Continue\r\n" + length, b"abc"), answers=2),
        Case("expect 100 no body", _post(cont + length)),
        Case("expect 100 on 1.0", _post(cont + length, b"abc", b"1.0")),
        Case("expect other", _post(b"Expect: foo\r\n" + length, b"abc")),
        Case("expect other then get", _post(b"Expect: foo\r\n" + length, b"abc") + get, answers=2),
        Case("expect chunked", _post(cont + chunked, b"3\r\nabc\r\n0\r\n\r\n"), answers=2),
        Case("unfinished cl", _post(b"Content-Length: 10\r\n", b"abc"), half_close=True),
        Case("unfinished chunk", _post(chunked, b"5\r\nab"), half_close=True),
        Case("unfinished chunk line", _post(chunked, b"5"), half_close=True),
        Case("unfinished trailer", _post(chunked, b"0\r\n"), half_close=True),
        Case(
            "unfinished get chunked",
            b"GET /u HTTP/1.1\r\n" + H + chunked + b"\r\n3\r\nabc\r\n",
            half_close=True,
        ),
        Case("unfinished head", b"GET / HTTP/1.1\r\nHost: h\r\n", half_close=True),
        Case("unfinished line", b"GET / HTT", half_close=True),
        Case("empty then close", b"", half_close=True),
        Case("upgrade websocket", b"GET /ws HTTP/1.1\r\n" + H + upgrade + b"websocket\r\n\r\n"),
        Case("upgrade h2c", b"GET / HTTP/1.1\r\n" + H + upgrade + b"h2c\r\n\r\n"),
        Case("handler error", b"GET /boom HTTP/1.1\r\n" + H + b"\r\n"),
        Case("handler error 1.0", b"GET /boom HTTP/1.0\r\n\r\n"),
        Case("handler error 1.0 kept", b"GET /boom HTTP/1.0\r\nConnection: keep-alive\r\n\r\n"),
        Case("handler error body", _post(length, b"abc").replace(b"/e ", b"/boom ")),
        Case("handler error pipelined", b"GET /boom HTTP/1.1\r\n" + H + b"\r\n" + get),
        Case("tls hello", b"\x16\x03\x01\x00\xa5\x01\x00\x00\xa1\x03\x03" + b"\x00" * 20),
        Case("binary junk", b"\x00\x01\x02\x03\r\n\r\n"),
    ]


def corpus() -> list[Case]:
    """Every case, names unique."""
    cases = _versions() + _sizes() + _lines() + _framing() + _chunked() + _streams()
    assert len({case.name for case in cases}) == len(cases)
    return cases
