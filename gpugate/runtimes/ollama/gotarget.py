"""A request-target as Go's net/http reads it (`url.ParseRequestURI`, then `readRequest`):
the absolute-form authority Go takes as the request's host, and the path gin routes on.

An Ollama listening where the gate listens judges the Host Go took from the request line
(`GET http://evil.example/api/tags` with `Host: localhost` is a request for evil.example),
so the gate must read the target as Go does, not as aiohttp does.
"""

from __future__ import annotations

import re
import string
import urllib.parse

import attrs


@attrs.frozen
class GoTarget:
    """What net/http takes from a request-target: `URL.Host` and `URL.Path`."""

    host: str
    """The absolute-form authority's host[:port] ("" for origin-form)."""
    path: str
    """The path, percent-decoded (gin routes on it)."""


class BadTarget(ValueError):
    """url.ParseRequestURI refuses the target: net/http answers 400 before any handler."""


_SCHEME_FIRST = frozenset(string.ascii_letters)
_SCHEME_REST = frozenset(string.ascii_letters + string.digits + "+-.")
_HEX = frozenset(string.hexdigits)
_HOST_CHARS = frozenset(string.ascii_letters + string.digits + "!$&'()*+,;=:[]<>\"-_.~")
"""Bytes below 0x80 that url.parseHost takes unescaped (url.go shouldEscape, encodeHost)."""
_USERINFO_CHARS = frozenset(string.ascii_letters + string.digits + "-._:~!$&'()*+,;=%@")


def _unescape(text: str, *, host: bool) -> str:
    """url.unescape in encodeHost or encodePath mode: BadTarget where Go fails."""
    i = 0
    while i < len(text):
        char = text[i]
        if char == "%":
            escape = text[i + 1 : i + 3]
            if len(escape) < 2 or not set(escape) <= _HEX:
                raise BadTarget(f"invalid URL escape {text[i : i + 3]!r}")
            # In a host, %-escapes stand only for non-ASCII bytes (and %25 for IPv6 zones).
            if host and int(escape[0], 16) < 8 and escape != "25":
                raise BadTarget(f"invalid URL escape {text[i : i + 3]!r}")
            i += 3
            continue
        if host and ord(char) < 0x80 and char not in _HOST_CHARS:
            raise BadTarget(f"invalid character {char!r} in host name")
        i += 1
    return urllib.parse.unquote(text, errors="surrogateescape")


def _valid_port(colon_port: str) -> bool:
    """url.validOptionalPort: nothing, or a colon and ASCII digits (possibly none)."""
    if colon_port == "":
        return True
    digits = colon_port[1:]
    return colon_port[0] == ":" and all(char in string.digits for char in digits)


def _parse_host(host: str) -> str:
    """url.parseHost: the port must be digits; IPv6 literals in brackets. Go 1.26.0 (the
    runtime's) takes the literal from the last "[" wherever it is and drops what comes
    before it (`http://evil[::1]/` names `[::1]`); Go 1.26.6 and 1.27 refuse that."""
    bracket = host.rfind("[")
    if bracket >= 0:
        end = host.rfind("]")
        if end < 0:
            raise BadTarget("missing ']' in host")
        if not _valid_port(host[end + 1 :]):
            raise BadTarget("invalid port after host")
        host = host[bracket:]
    else:
        colon = host.rfind(":")
        if colon >= 0 and not _valid_port(host[colon:]):
            raise BadTarget("invalid port after host")
    return _unescape(host, host=True)


_CONTROL = re.compile("[\x00-\x1f\x7f]")


def parse_target(target: str) -> GoTarget:
    """url.ParseRequestURI as net/http's readRequest calls it (url.go `parse`, viaRequest)."""
    if _CONTROL.search(target):
        raise BadTarget("invalid control character in URL")
    if target.startswith("/") and "%" not in target:
        # Origin-form with nothing escaped, nearly every request: no scheme, no host, and
        # the path is its own unescaping.
        return GoTarget("", target.partition("?")[0])
    if target == "*":
        return GoTarget("", "*")
    scheme, rest = "", target
    for index, char in enumerate(target):
        if char == ":":
            if index == 0:
                raise BadTarget("missing protocol scheme")
            scheme, rest = target[:index].lower(), target[index + 1 :]
            break
        if char in _SCHEME_FIRST or (index > 0 and char in _SCHEME_REST):
            continue
        break
    rest = rest.partition("?")[0]  # the query, or ForceQuery's lone "?": not the path
    if not rest.startswith("/"):
        if scheme:
            return GoTarget("", "")  # opaque: no host, no path
        raise BadTarget("invalid URI for request")
    host = ""
    if scheme and rest.startswith("//"):
        authority, slash, path = rest[2:].partition("/")
        rest = slash + path
        at = authority.rfind("@")
        if at >= 0 and not set(authority[:at]) <= _USERINFO_CHARS:
            raise BadTarget("net/url: invalid userinfo")
        host = _parse_host(authority[at + 1 :])
        if at >= 0:
            _unescape(authority[:at], host=False)
    return GoTarget(host, _unescape(rest, host=False))
