"""How whisper-server reads a /load form, the real build and the simulator alike: cpp-httplib's
boundary, its parts, repeated fields, encodings it does not undo, and what depends on where
its socket reads split a body. What each case loads is read off the server's stderr."""

from __future__ import annotations

import base64

import attrs
import pytest

from tests.whisper.conftest import Models, StartServer, WhisperServer
from tests.whisper.wire import (
    BOUNDARY,
    Answer,
    Connection,
    exchange,
    form,
    form_type,
    load,
    model_form,
    part,
    request,
)

OK = (200, b"Load was successful!")
INVALID = (400, b"Invalid request")


@pytest.fixture(scope="module")
def server(module_starter: StartServer, models: Models) -> WhisperServer:
    return module_starter(["-m", str(models.english)])


@attrs.frozen
class Outcome:
    said: tuple[int, bytes]
    loaded: list[str]


def loading(server: WhisperServer, send: object) -> Outcome:
    """What `send()` got and which models the server started to load meanwhile."""
    before = len(server.loads())
    answer = send()  # type: ignore[operator]
    assert isinstance(answer, Answer)
    return Outcome(answer.said, server.loads()[before:])


def test_a_plain_form_loads_its_model(server, models):
    got = loading(server, lambda: load(server.port, model_form(str(models.english_other))))
    assert got == Outcome(OK, [str(models.english_other)])


@pytest.mark.parametrize(
    ("content_type", "body_boundary", "loads"),
    [
        # The first `boundary=` anywhere in the value, even inside another parameter's name.
        (b"multipart/form-data; xboundary=AAA; boundary=BBB", b"AAA", True),
        (b"multipart/form-data; xboundary=AAA; boundary=BBB", b"BBB", False),
        (b'multipart/form-data; boundary="AAA"', b"AAA", True),
        # Up to the next `;`, spaces and all.
        (b"multipart/form-data; boundary=AAA ; charset=utf-8", b"AAA", False),
        (b"multipart/form-data; charset=utf-8; boundary=AAA", b"AAA", True),
        # Header values are percent-decoded as they are read.
        (b"multipart%2Fform-data; boundary%3DAAA", b"AAA", True),
        (b"multipart/form-data; boundary=%41%41%41", b"AAA", True),
        # The media type's case matters: this is no form at all.
        (b"Multipart/Form-Data; boundary=AAA", b"AAA", False),
        (b"multipart/form-dataX; boundary=AAA", b"AAA", True),
        (b"multipart/form-data", b"AAA", False),
        (b"multipart/form-data; boundary=", b"AAA", False),
        (b"multipart/mixed; boundary=AAA", b"AAA", False),
    ],
)
def test_the_boundary_is_cpp_httplibs(server, models, content_type, body_boundary, loads):
    body = model_form(str(models.english), boundary=body_boundary)
    got = loading(server, lambda: load(server.port, body, content_type))
    assert got == (Outcome(OK, [str(models.english)]) if loads else Outcome(INVALID, []))


def test_of_two_content_type_headers_the_last_counts(server, models):
    body = model_form(str(models.english))
    wrong, right = form_type(b"OTHER"), form_type()
    for first, last, loads in ((wrong, right, True), (right, wrong, False)):
        types = [b"Content-Type: " + first, b"Content-Type: " + last]
        raw = request("POST", "/load", body, headers=types)
        got = loading(server, lambda raw=raw: exchange(server.port, raw))
        assert got == (Outcome(OK, [str(models.english)]) if loads else Outcome(INVALID, []))


def test_of_two_model_fields_the_first_counts(server, models):
    body = form(part("model", str(models.english_other)), part("model", str(models.english)))
    assert loading(server, lambda: load(server.port, body)) == Outcome(
        OK, [str(models.english_other)]
    )


def test_an_encoded_part_is_read_as_sent(server, models):
    path = str(models.english).encode()
    encoded = base64.b64encode(path)
    cte = [b"Content-Transfer-Encoding: base64"]
    got = loading(server, lambda: load(server.port, form(part("model", encoded, headers=cte))))
    assert got == Outcome(INVALID, []), "base64 is not undone: no such file"
    got = loading(server, lambda: load(server.port, form(part("model", path, headers=cte))))
    assert got == Outcome(OK, [str(models.english)]), "the header changes nothing"
    quoted = path.replace(b".", b"=2E")
    qp = [b"Content-Transfer-Encoding: quoted-printable"]
    got = loading(server, lambda: load(server.port, form(part("model", quoted, headers=qp))))
    assert got == Outcome(INVALID, [])


@pytest.mark.parametrize(
    ("disposition", "loads"),
    [
        (b"form-data; name=model", True),
        (b'FORM-DATA; name="model"', True),
        (b'form-data;name="model"', True),
        (b'form-data; name="model"; name="other"', True),
        (b'form-data; name="other"; name="model"', False),
        (b'form-data; name="model"; filename="m.bin"', True),
        (b"form-data; name=\"model\"; filename*=UTF-8''m%20b.bin", True),
        (b"form-data; name=\"model\"; filename*=latin1''m.bin", False),
        (b'form-data; NAME="model"', False),
        (b'attachment; name="model"', False),
        (b'form-data; name="mo=del"', False),
        (b'form-data; filename="model"', False),
    ],
)
def test_the_part_name_is_read_from_its_disposition(server, models, disposition, loads):
    body = form(part("", str(models.english), disposition=disposition))
    got = loading(server, lambda: load(server.port, body))
    assert got == (Outcome(OK, [str(models.english)]) if loads else Outcome(INVALID, []))


@pytest.mark.parametrize(
    ("shape", "loads"),
    [
        ("preamble", True),
        ("preamble-mid-line", True),
        ("epilogue", True),
        ("no-close", False),
        ("junk-after-delimiter", False),
        ("header-without-colon", False),
        ("lf-only", False),
        ("nul-in-path", True),
        ("empty-path", False),
        ("no-parts", False),
    ],
)
def test_the_parts_are_cpp_httplibs(server, models, shape, loads):
    path = str(models.english).encode()
    delimiter = b"--" + BOUNDARY
    body = {
        "preamble": b"This is a preamble.\r\n" + model_form(path),
        "preamble-mid-line": b"xx" + model_form(path),
        "epilogue": model_form(path) + b"\r\nan epilogue with --XyZzY-- in it",
        "no-close": part("model", path),
        "junk-after-delimiter": part("model", path) + delimiter + b" junk\r\n",
        "header-without-colon": form(part("model", path, headers=[b"Junk"])),
        "lf-only": (
            delimiter + b'\nContent-Disposition: form-data; name="model"\n\n' + path + b"\n"
            + delimiter + b"--\n"
        ),
        "nul-in-path": form(part("model", path + b"\0/elsewhere")),
        "empty-path": form(part("model", b"")),
        "no-parts": delimiter + b"--\r\n",
    }[shape]  # fmt: skip
    got = loading(server, lambda: load(server.port, body))
    assert got == (Outcome(OK, [str(models.english)]) if loads else Outcome(INVALID, []))


def test_a_first_header_line_past_8_kib_is_refused_a_later_one_split_by_reads_too(server, models):
    path = str(models.english)
    disposition = b'Content-Disposition: form-data; name="model"\r\n'
    long_first = b"--" + BOUNDARY + b"\r\nX: " + b"a" * 8200 + b"\r\n" + disposition
    long_first += b"\r\n" + path.encode() + b"\r\n--" + BOUNDARY + b"--\r\n"
    assert loading(server, lambda: load(server.port, long_first)) == Outcome(INVALID, [])
    # A long line after the first is checked only where a read leaves the parser at it.
    long_later = form(part("model", path, headers=[b"X: " + b"a" * 9000]))
    assert loading(server, lambda: load(server.port, long_later)) == Outcome(INVALID, [])
    short_later = form(part("model", path, headers=[b"X: " + b"a" * 8000]))
    assert loading(server, lambda: load(server.port, short_later)) == Outcome(OK, [path])


def test_more_than_1024_parts_is_refused(server, models):
    path = str(models.english)
    filler = b"".join(part(f"f{i}", "x") for i in range(1023))
    got = loading(server, lambda: load(server.port, form(filler + part("model", path))))
    assert got == Outcome(OK, [path]), "1,024 parts"
    filler += part("f1023", "x")
    got = loading(server, lambda: load(server.port, form(filler + part("model", path))))
    assert got == Outcome(INVALID, []), "1,025 parts"


def test_a_large_body_is_read_whole(server, models):
    path = str(models.english_other)
    body = form(part("pad", b"p" * 70_000), part("model", path))
    assert loading(server, lambda: load(server.port, body)) == Outcome(OK, [path])
    big = form(part("pad", b"p" * 3_000_000), part("model", str(models.english)))
    assert loading(server, lambda: load(server.port, big)) == Outcome(OK, [str(models.english)])


def test_a_chunked_body_is_read(server, models):
    body = model_form(str(models.english))
    chunks = b"".join(b"%x\r\n%s\r\n" % (len(c), c) for c in (body[:10], body[10:]))
    raw = request(
        "POST", "/load", chunks + b"0\r\n\r\n", content_type=form_type(),
        headers=[b"Transfer-Encoding: chunked"], length=False,
    )  # fmt: skip
    assert loading(server, lambda: exchange(server.port, raw)) == Outcome(OK, [str(models.english)])


@pytest.mark.parametrize(
    ("coding", "loads"),
    [("gzip", False), ("deflate", False), ("zstd", False), ("xbrx", False), ("identity", True)],
)
def test_an_encoded_body_is_refused_unread(server, models, coding, loads):
    raw = request(
        "POST", "/load", model_form(str(models.english)), content_type=form_type(),
        headers=[f"Content-Encoding: {coding}".encode()],
    )  # fmt: skip
    got = loading(server, lambda: exchange(server.port, raw))
    expected = (
        Outcome(OK, [str(models.english)])
        if loads
        else Outcome((404, b"File Not Found (/load)"), [])
    )
    assert got == expected


def test_expect_100_continue_is_answered_before_the_body(server, models):
    body = model_form(str(models.english))
    raw = request("POST", "/load", b"", content_type=form_type(), headers=[b"Expect: 100-continue"])
    raw = raw.replace(b"Content-Length: 0", b"Content-Length: %d" % len(body))
    with Connection(server.port) as conn:
        conn.send(raw)
        assert conn.answer(head_only=True).status == 100
        conn.send(body)
        assert conn.answer().said == OK


def padded(raw_head_without_end: bytes, size: int) -> bytes:
    """A head of exactly `size` bytes (its blank line included), padded with a header."""
    short = size - len(raw_head_without_end) - len(b"X-Pad: \r\n\r\n")
    assert short >= 0
    return raw_head_without_end + b"X-Pad: " + b"p" * short + b"\r\n\r\n"


def head_for(body: bytes, size: int) -> bytes:
    line = b"POST /load HTTP/1.1\r\nHost: x\r\nContent-Type: " + form_type() + b"\r\n"
    line += b"Content-Length: %d\r\n" % len(body)
    return padded(line, size)


def test_a_first_delimiter_split_by_a_read_is_not_seen(server, models):
    """The server reads the head 4 KiB at a time; the rest of that read is the body's first
    piece. Ending it inside `--BOUNDARY\\r\\n`, the parser drops the piece and starts at the
    next delimiter: of two `model` parts, the second loads."""
    first, second = str(models.english_other), str(models.english)
    body = form(part("model", first), part("model", second))
    raw = head_for(body, 4096 - 3) + body
    assert loading(server, lambda: exchange(server.port, raw)) == Outcome(OK, [second])
    whole = head_for(body, 200) + body
    assert loading(server, lambda: exchange(server.port, whole)) == Outcome(OK, [first])


def test_after_the_close_a_new_read_starting_a_line_is_read_as_more_parts(server, models):
    """The closing delimiter ends the parse only for the read it is in: a later read that
    starts with CRLF opens another part, and the form stays valid."""
    path = str(models.english).encode()
    closed = form(part("other", "x"))[: -len(b"\r\n")]  # ... --BOUNDARY--
    opened = part("model", path)[len(b"--" + BOUNDARY + b"\r\n") :]
    more = b"\r\n" + opened + b"--" + BOUNDARY + b"--\r\n"
    body = closed + more
    raw = head_for(body, 4096 - len(closed)) + body
    assert loading(server, lambda: exchange(server.port, raw)) == Outcome(OK, [path.decode()])
    whole = head_for(body, 200) + body
    assert loading(server, lambda: exchange(server.port, whole)) == Outcome(INVALID, [])
