"""ComfyUI's origin check (`server.py` `create_origin_only_middleware`) and its CORS
middleware (`create_cors_middleware`, with `--enable-cors-header`), as the gate runs them
where it listens.

When the `Host`'s hostname is loopback (an IP, or a name every address of which is
loopback) and an `Origin` is present, their netlocs must match, ports compared only when
both carry one; the scheme is ignored (runtime-contracts §2.6, §6). Both headers are read
from the request's headers (`request.headers['Host']`), so an absolute-form request-target
(`GET http://other/ HTTP/1.1`), which aiohttp's `request.host` would prefer, plays no part.
"""

from __future__ import annotations

import enum
import ipaddress
import socket
import urllib.parse

from yarl import URL

NAME_CACHE_LIMIT = 256
_names: dict[str, bool | None] = {}


class Verdict(enum.Enum):
    """What the origin middleware does with a request."""

    PASS = "pass"
    MISMATCH = "mismatch"
    """403 with an empty body."""
    ERROR = "error"
    """The middleware raises (a port that is not a number, a malformed IPv6 literal, a
    name IDNA cannot encode): aiohttp answers 500 and nothing is routed."""


class _Raises(Exception):
    """The middleware would raise here."""


def is_loopback(host: str | None) -> bool:
    """True for a loopback IP, or a name every address of which is loopback; raises
    `_Raises` where ComfyUI's own `is_loopback` raises."""
    if not host:
        return False
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        pass
    try:
        cached = _names[host]
    except KeyError:
        cached = _resolve_loopback(host)
        if len(_names) < NAME_CACHE_LIMIT:
            _names[host] = cached
    if cached is None:
        raise _Raises(host)
    return cached


def _resolve_loopback(host: str) -> bool | None:
    """server.py `is_loopback`: None where it raises (it catches socket.gaierror only)."""
    loopback = False
    for family in (socket.AF_INET, socket.AF_INET6):
        try:
            infos = socket.getaddrinfo(host, None, family, socket.SOCK_STREAM)
        except socket.gaierror:
            continue
        except (UnicodeError, OSError):
            return None
        for *_, sockaddr in infos:
            if not ipaddress.ip_address(sockaddr[0]).is_loopback:
                return False
            loopback = True
    return loopback


def origin_verdict(host: str, origin: str) -> Verdict:
    """`create_origin_only_middleware` (server.py 107-141) for these Host and Origin headers."""
    try:
        host_domain: str | None = host.lower()
        parsed = urllib.parse.urlparse(origin)
        origin_domain: str | None = parsed.netloc.lower()
        host_parsed = urllib.parse.urlsplit("//" + host.lower())
        loopback = is_loopback(host_parsed.hostname)
        if parsed.port is None:
            host_domain = host_parsed.hostname
        if host_parsed.port is None:
            origin_domain = parsed.hostname
    except (ValueError, _Raises):
        return Verdict.ERROR
    if loopback and host_domain and origin_domain and host_domain != origin_domain:
        return Verdict.MISMATCH
    return Verdict.PASS


SERVER_ERROR_TITLE = "500 Internal Server Error"
SERVER_ERROR_TEXT = "Server got itself in trouble"


def server_error(accept: str) -> tuple[bytes, str]:
    """Body and Content-Type of aiohttp's answer to a handler that raised
    (web_protocol `handle_error`, without a debug traceback)."""
    if "text/html" in accept:
        html = (
            f"<html><head><title>{SERVER_ERROR_TITLE}</title></head><body>\n"
            f"<h1>{SERVER_ERROR_TITLE}</h1>\n{SERVER_ERROR_TEXT}\n</body></html>\n"
        )
        return html.encode(), "text/html; charset=utf-8"
    return f"{SERVER_ERROR_TITLE}\n\n{SERVER_ERROR_TEXT}".encode(), "text/plain; charset=utf-8"


# -- --enable-cors-header, and what ComfyUI's other middleware adds ------------------------------

CORS_METHODS = "POST, GET, DELETE, PUT, OPTIONS"
CORS_ALLOW_HEADERS = "Content-Type, Authorization"


def cors_headers(allowed_origin: str) -> tuple[tuple[str, str], ...]:
    """The four headers `create_cors_middleware` puts on every answer, in its order."""
    return (
        ("Access-Control-Allow-Origin", allowed_origin),
        ("Access-Control-Allow-Methods", CORS_METHODS),
        ("Access-Control-Allow-Headers", CORS_ALLOW_HEADERS),
        ("Access-Control-Allow-Credentials", "true"),
    )


IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")
CACHED_STATUSES = frozenset({200, 201, 202, 203, 204, 205, 206, 301, 308})


def cache_headers(path: str, status: int) -> tuple[tuple[str, str], ...]:
    """What `middleware/cache_middleware.py` adds to an answer (it wraps the origin and CORS
    middleware, so their own answers get it too)."""
    name = path.rsplit("/", 1)[-1]
    if path.endswith((".js", ".css")) or (name.startswith("index") and name.endswith(".json")):
        return (("Cache-Control", "no-cache"),)
    if not path.lower().endswith(IMAGE_SUFFIXES):
        return ()
    if status == 404:
        return (("Cache-Control", "public, max-age=3600"),)
    if status in CACHED_STATUSES:
        return (("Cache-Control", "public, max-age=86400"),)
    if status in (302, 303, 307):
        return (("Cache-Control", "no-cache"),)
    return ()


def request_path(target: str) -> str:
    """aiohttp's `request.path` for a request-target as the client wrote it ("" if none)."""
    if not target:
        return ""
    try:
        if target.startswith("/"):
            # http_parser: fragment, then query, split off before the path is decoded.
            path_part = target.partition("#")[0].partition("?")[0]
            return URL.build(path=path_part, encoded=True).path
        return URL(target, encoded=True).path
    except ValueError:
        return ""
