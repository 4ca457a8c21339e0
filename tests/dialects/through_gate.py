"""What a client sees of a server's answers, for comparing a gate in front of an oracle
with the oracle itself (test_through_gate.py).

The gate re-sends each request upstream as HTTP/1.1 with its own framing, so an echo
server's body differs in what the framing says; what the client must see alike is the
sequence of status lines, each answer's header fields (less `Date`, the gate's own
`X-GPUGate-*`, and an echo's `Content-Length`, whose value for an answer to HEAD is
compared only for being there), whether the connection ended, and for an echo the method,
target and body it read.
"""

from __future__ import annotations

import contextlib
import enum
import socket

import attrs

from tests.dialects.wire import Outcome, normalise

CLOSING_PROBE = b"GET /probe HTTP/1.1\r\nHost: localhost:11434\r\nConnection: close\r\n\r\n"
"""Sent after a case on a connection kept open: a server that still reads it answers it and
closes, so the exchange ends without the client's half-close."""

ECHO_FIELDS = ("method ", "target ", "body ")
"""The lines of the Go echo's body (tests/oracle/nethttp/main.go `echo`) that say what the
upstream read of the client's request; its proto, header and framing lines are the gate's."""


@attrs.frozen
class Answer:
    """One answer parsed off the wire."""

    status: bytes
    fields: tuple[tuple[str, str], ...]
    body: bytes
    headless: bool = False
    """It announced a body (a Content-Length above 0) and none followed: an answer to HEAD."""


class Difference(enum.Enum):
    """How the gate's answers to one case differ from the oracle's, first that applies."""

    SAME = "same"
    UNANSWERED = "unanswered"
    """The oracle answered, the gate wrote nothing, or only the first of the oracle's
    answers alike (a `100 Continue`, the first of two pipelined requests): the client
    half-closed before the rest, and the gate takes that as the client gone (server.py
    `eof_received`)."""
    GATE_ANSWERED = "gate-answered"
    """Other status lines, and the gate wrote an answer of its own (X-GPUGate-* on it):
    the runtime's handler rules the gate applies, or its admission."""
    HANDLER_RULES = "handler-rules"
    """Other status lines where the oracle's echo handler answered and the gate answered
    for the runtime's own handler (Ollama's Host check, its CORS preflight, its routes):
    what the runtime itself would answer, which an echo server does not; or the
    upstream's own refusal of the head the gate re-sent (its Host and X-Forwarded-For
    pushing a head past aiohttp's limits)."""
    STATUS = "status"
    """Other status lines at the server's level: a dialect difference."""
    FIELDS = "fields"
    """The same status lines, other header fields."""
    ECHO = "echo"
    """The upstream read another method, target or body."""
    ENDED = "ended"
    """The same answers; the connection ended where the oracle's did not, or the reverse."""


def _body(rest: bytes, fields: tuple[tuple[str, str], ...], status: int) -> tuple[bytes, bytes]:
    if status < 200 or status in (204, 304) or rest.startswith(b"HTTP/"):
        return b"", rest  # no body (a HEAD's answer included)
    lookup = {name.lower(): value for name, value in fields}
    if lookup.get("transfer-encoding", "").lower() == "chunked":
        body, pos = b"", 0
        while True:
            end = rest.find(b"\r\n", pos)
            if end < 0:
                return body + rest[pos:], b""
            size = int(rest[pos:end].split(b";")[0] or b"0", 16)
            if size == 0:
                trailer = rest.find(b"\r\n\r\n", end)
                return body, rest[trailer + 4 :] if trailer >= 0 else b""
            body += rest[end + 2 : end + 2 + size]
            pos = end + 2 + size + 2
    if "content-length" in lookup:
        length = int(lookup["content-length"])
        return rest[:length], rest[length:]
    return rest, b""


def answers(data: bytes) -> list[Answer]:
    """Every answer in `data`, in order (interim 1xx answers included)."""
    out: list[Answer] = []
    while data.startswith(b"HTTP/"):
        end = data.find(b"\r\n\r\n")
        if end < 0:
            out.append(Answer(data.split(b"\r\n")[0], (), b""))
            break
        lines = data[:end].split(b"\r\n")
        fields = tuple(
            (name.decode("latin-1"), value.decode("latin-1").strip())
            for name, _, value in (line.partition(b":") for line in lines[1:])
        )
        status = int(lines[0].split(b" ")[1])
        body, data = _body(data[end + 4 :], fields, status)
        length = next((v for n, v in fields if n.lower() == "content-length"), "0")
        headless = not body and length.isdigit() and int(length) > 0
        out.append(Answer(lines[0], fields, body, headless))
    return out


ECHO_TYPE = "text/plain; charset=utf-8"
"""The Content-Type of both echoes' answers (the Go echo's and aiohttp_reference.py's)."""
ECHO_LENGTH = "(the length of the echo's text)"


def _echo_head(answer: Answer) -> bool:
    """An echo's answer to HEAD: its Content-Length is that of the text the echo would have
    written, which describes the request as its server read it, so through the gate the
    re-sent head's (its Host, X-Forwarded-For and framing); a runtime's handler answers a
    HEAD with a length of its own, the same whoever sent the request (net/http sets it from
    what the handler wrote, server.go `writeHeader`; aiohttp from the body it was given)."""
    return answer.headless and any(
        name.lower() == "content-type" and value == ECHO_TYPE for name, value in answer.fields
    )


def _shown(answer: Answer) -> tuple[tuple[str, str], ...]:
    echo = bool(_echo(answer))
    head = _echo_head(answer)
    kept = [
        (name.lower(), ECHO_LENGTH if head and name.lower() == "content-length" else value)
        for name, value in answer.fields
        if name.lower() != "date"
        and not name.lower().startswith("x-gpugate-")
        and not (echo and name.lower() == "content-length")
    ]
    return tuple(sorted(kept))


def _echo(answer: Answer) -> tuple[str, ...]:
    text = answer.body.decode("utf-8", "replace")
    if answer.body.startswith(b"method "):
        return tuple(line for line in text.split("\n") if line.startswith(ECHO_FIELDS))
    lines = text.split("\n")
    if len(lines) >= 2 and lines[-1].startswith("body ") and lines[0].count(" ") == 2:
        # tests/dialects/dialect_server.py `echo_text`: "METHOD target version", the
        # headers, "body N ...": the method, target and body (the version is the gate's)
        return (lines[0].rsplit(" ", 1)[0], lines[-1])
    return ()


def _alike(want: list[Answer], got: list[Answer]) -> bool:
    """The same answers: status lines, shown fields and what the echo read."""
    return (
        [a.status for a in want] == [a.status for a in got]
        and [_shown(a) for a in want] == [_shown(a) for a in got]
        and [_echo(a) for a in want] == [_echo(a) for a in got]
    )


def classify(oracle: Outcome, gate: Outcome) -> Difference:
    """How the gate's outcome differs from the oracle's (see `Difference`)."""
    want, got = answers(oracle.data), answers(gate.data)
    if len(got) < len(want) and gate.ended == "closed" and _alike(want[: len(got)], got):
        return Difference.UNANSWERED
    if [a.status for a in want] != [a.status for a in got]:
        if any(name.lower().startswith("x-gpugate-") for a in got for name, _ in a.fields):
            return Difference.GATE_ANSWERED
        for direct, gated in zip(want, got, strict=False):
            if direct.status != gated.status:
                if _echo(direct) and not _echo(gated):
                    return Difference.HANDLER_RULES
                break
        return Difference.STATUS
    if [_shown(a) for a in want] != [_shown(a) for a in got]:
        return Difference.FIELDS
    if [_echo(a) for a in want] != [_echo(a) for a in got]:
        return Difference.ECHO
    if oracle.ended != gate.ended:
        return Difference.ENDED
    return Difference.SAME


def exchange_open(address: tuple[str, int], data: bytes, timeout: float) -> Outcome:
    """Send `data` and `CLOSING_PROBE` on a fresh connection without half-closing it, and
    read until the server closes (or `timeout` passes with it open: "open")."""
    sock = socket.create_connection(address, timeout=timeout)
    chunks, ended = [], "closed"
    try:
        with contextlib.suppress(OSError):
            sock.sendall(data + CLOSING_PROBE)
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    except TimeoutError:
        ended = "open"
    except ConnectionResetError:
        pass
    finally:
        sock.close()
    return Outcome(normalise(b"".join(chunks)), ended)
