"""A request head as cpp-httplib reads it: its line reader, request line and header checks,
and the framing and keep-alive it takes from them (httplib.py's dialects)."""

from __future__ import annotations

import enum
import re

from gpugate.proxy.dialects.base import Framing, Refusal, RequestHead, ServerDefaults

HEADER_MAX_LENGTH = 8192
HEADER_MAX_COUNT = 100
MAX_LINE_LENGTH = 32768
METHODS = frozenset(
    ("GET", "HEAD", "POST", "PUT", "DELETE", "CONNECT", "OPTIONS", "TRACE", "PATCH", "PRI")
)
BODY_METHODS = frozenset(("POST", "PUT", "PATCH", "DELETE"))
"""0.20 `expect_content`: methods whose body `routing` reads before any handler."""
FIELD_NAME = re.compile(rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
"""`fields::is_field_name`: a token."""
FIELD_VALUE = re.compile(
    rb"(?:[\x21-\x7e\x80-\xff](?:[\x21-\x7e\x80-\xff \t]*[\x21-\x7e\x80-\xff])?)?"
)
"""`fields::is_field_value`: visible bytes (obs-text too), blanks only inside."""


class Release(enum.Enum):
    """The cpp-httplib release a runtime vendors."""

    V0_20 = "0.20.0"
    V0_58 = "0.58.0"


def token_has(value: str, token: str) -> bool:
    """0.58's `has_header_token`: a comma-separated list holding `token`, any case."""
    return any(part.strip().lower() == token for part in value.split(","))


class HttplibHeadReading(ServerDefaults):
    """The part of httplib.py's `HttplibDialect` that reads a request head (its release,
    target limit and error answers are the dialect's; the rules it overrides, too)."""

    __slots__ = ()

    def read_head(self, buffer: bytes, date: bytes) -> RequestHead | Refusal | None:
        """The first request's head in `buffer` by httplib's line reader and checks."""
        end = buffer.find(b"\r\n")
        if end < 0:
            if self.release is Release.V0_58 and len(buffer) > MAX_LINE_LENGTH:
                return Refusal(b"", close=True)
            return None
        if self.release is Release.V0_58 and end + 2 > MAX_LINE_LENGTH:
            return Refusal(b"", close=True)
        line = buffer[:end].split(b"\x00", 1)[0]
        parts = [p.strip(b" \t") for p in line.split(b" ")]
        parts = [p for p in parts if p]
        target = parts[1].decode("latin-1") if len(parts) > 1 else ""
        path = target.split("#", 1)[0].split("?", 1)[0]
        request_ok = (
            len(parts) == 3
            and parts[0].decode("latin-1") in METHODS
            and parts[2] in (b"HTTP/1.1", b"HTTP/1.0")
        )
        if not request_ok:
            # Refused before a header line is read (`process_request`).
            return self._refuse(400, path, close=False)
        fields: list[tuple[str, str]] = []
        pos = end + 2
        while True:
            stop = buffer.find(b"\r\n", pos)
            if stop < 0:
                return None
            raw = buffer[pos:stop]
            pos = stop + 2
            if not raw:
                break
            # `read_headers` gives up at the first bad line, not at the blank one.
            too_many = self.release is Release.V0_58 and len(fields) >= HEADER_MAX_COUNT
            parsed = None if too_many or len(raw) + 2 > HEADER_MAX_LENGTH else parse_field(raw)
            if parsed is None:
                return self._refuse(400, path, close=False)
            fields.append(parsed)
        return self._checked(parts, target, path, tuple(fields), pos)

    def _checked(
        self,
        parts: list[bytes],
        target: str,
        path: str,
        fields: tuple[tuple[str, str], ...],
        size: int,
    ) -> RequestHead | Refusal:
        method = parts[0].decode("latin-1")
        version = (1, 1) if parts[2] == b"HTTP/1.1" else (1, 0)
        values: dict[str, list[str]] = {}
        for name, value in fields:
            values.setdefault(name.lower(), []).append(value)
        lengths = values.get("content-length", [])
        encodings = values.get("transfer-encoding", [])
        connection = values.get("connection", [""])[0]
        v58 = self.release is Release.V0_58
        if v58:
            if len(set(lengths)) > 1:
                return self._refuse(400, path, close=False)
            conflicting = any(v.strip() not in ("", "0") for v in lengths) and bool(encodings)
            final = ",".join(encodings).split(",")[-1].strip().lower() if encodings else ""
            if conflicting or (encodings and final != "chunked"):
                return self._refuse(400, path, close=True)
            if len(target) > self.uri_max:
                return self._refuse(414, path, close=True)
            closing = any(token_has(v, "close") for v in values.get("connection", []))
            if version == (1, 0) and not any(
                token_has(v, "keep-alive") for v in values.get("connection", [])
            ):
                closing = True
        else:
            if len(target) > self.uri_max:
                return self._refuse(414, path, close=False, keep=True)
            closing = connection == "close" or (version == (1, 0) and connection != "Keep-Alive")
        # 0.58 refused any other coding above; 0.20 `is_chunked_transfer_encoding` asks
        # that the first Transfer-Encoding be exactly `chunked`, any case.
        chunked = bool(encodings) and (v58 or encodings[0].lower() == "chunked")
        framing, length = Framing.NONE, 0
        if chunked:
            framing = Framing.CHUNKED
        elif not v58 and not lengths and method in BODY_METHODS:
            # 0.20 `read_content`: no length and not chunked is read to the close.
            framing = Framing.UNTIL_CLOSE
        elif lengths:
            try:
                length = int(lengths[0])
            except ValueError:
                length = 0
            framing = Framing.LENGTH if length > 0 else Framing.NONE
        expect = values.get("expect", [""])[0]
        if v58:
            expect_continue = version != (1, 0) and token_has(expect, "100-continue")
        else:
            expect_continue = expect == "100-continue"
        return RequestHead(
            method=method,
            target=target,
            version=version,
            headers=fields,
            framing=framing,
            length=length,
            keep_alive=not closing,
            expect_continue=expect_continue,
            upgrade=v58 and any(token_has(v, "upgrade") for v in values.get("connection", [])),
            size=size,
        )


def parse_field(raw: bytes) -> tuple[str, str] | None:
    """`parse_header`: trailing blanks dropped, a token name, a colon, leading blanks
    skipped, a field value."""
    raw = raw.rstrip(b" \t")
    name, colon, value = raw.partition(b":")
    if not colon or FIELD_NAME.fullmatch(name) is None:
        return None
    value = value.lstrip(b" \t")
    if FIELD_VALUE.fullmatch(value) is None:
        return None
    return name.decode("latin-1"), value.decode("latin-1")
