"""Ollama's CORS and Host checks, which run before every route.

CORS (gin-contrib/cors as Ollama configures it): a request with an `Origin` that is not
its own host must come from an allowed origin, else 403 with an empty body; a preflight
from an allowed origin is answered 204 at once. Host check (`allowedHostsMiddleware`):
only when the server listens on a loopback address, the `Host` header must name this
machine (a loopback, private, unspecified or local-interface IP, `localhost`, the
hostname, or a name under .localhost, .local or .internal), else 403 with an empty body.
"""

from __future__ import annotations

import contextlib
import fcntl
import ipaddress
import socket
import struct
from collections.abc import Awaitable, Callable

from aiohttp import web
from multidict import CIMultiDict

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

ALLOW_METHODS = "GET,POST,PUT,PATCH,DELETE,HEAD,OPTIONS"
# GenerateRoutes' AllowHeaders as gin-contrib/cors writes them: lower-cased, then
# canonicalised by http.CanonicalHeaderKey ("OpenAI-Beta" -> "Openai-Beta").
ALLOW_HEADERS = ",".join(
    "-".join(part.capitalize() for part in name.split("-"))
    for name in [
        "Authorization",
        "Content-Type",
        "User-Agent",
        "Accept",
        "X-Requested-With",
        "OpenAI-Beta",
        "x-stainless-arch",
        "x-stainless-async",
        "x-stainless-custom-poll-interval",
        "x-stainless-helper-method",
        "x-stainless-lang",
        "x-stainless-os",
        "x-stainless-package-version",
        "x-stainless-poll-helper",
        "x-stainless-retry-count",
        "x-stainless-runtime",
        "x-stainless-runtime-version",
        "x-stainless-timeout",
    ]
)
MAX_AGE = str(12 * 3600)
PREFLIGHT_VARY = ("Origin", "Access-Control-Request-Method", "Access-Control-Request-Headers")
LOCAL_SUFFIXES = (".localhost", ".local", ".internal")
GIN_METHOD_ORDER = ("HEAD", "GET", "POST", "DELETE")
"""The order of gin's method trees in Ollama's GenerateRoutes (first registration wins)."""


def allowed_origins(extra: tuple[str, ...]) -> tuple[str, ...]:
    """envconfig.AllowedOrigins: OLLAMA_ORIGINS plus the built-in local origins."""
    origins = list(extra)
    for host in ("localhost", "127.0.0.1", "0.0.0.0"):
        origins += [f"http://{host}", f"https://{host}", f"http://{host}:*", f"https://{host}:*"]
    origins += ["app://*", "file://*", "tauri://*", "vscode-webview://*", "vscode-file://*"]
    return tuple(origins)


def _origin_allowed(origin: str, origins: tuple[str, ...]) -> bool:
    """gin-contrib/cors v1.7.2 validateOrigin: exact entries (lower-cased and trimmed, the
    request's origin as sent), then wildcard rules built from the entries as written.

    A rule splits its entry at the star: "http://localhost:*" is the prefix
    "http://localhost:" (its colon kept), so "http://localhost.evil.example" does not pass.
    Browser-extension schemes only pass cors.Config.Validate; they are not let in by scheme.
    """
    normalized = [o.strip().lower() for o in origins]
    if "*" in normalized or origin in normalized:
        return True
    for entry in origins:
        star = entry.find("*")
        if star < 0:
            continue
        prefix, suffix = ("*", entry[1:]) if star == 0 else (entry[:star], entry[star + 1 :])
        if star == len(entry) - 1:
            suffix = "*"
        if prefix == "*" and origin.endswith(suffix):
            return True
        if suffix == "*" and origin.startswith(prefix):
            return True
        if origin.startswith(prefix) and origin.endswith(suffix):
            return True
    return False


def _interface_addresses() -> set[str]:
    """IPv4 addresses of the local interfaces, plus whatever the hostname resolves to."""
    found: set[str] = set()
    with contextlib.suppress(OSError):
        for info in socket.getaddrinfo(socket.gethostname(), None):
            found.add(str(info[4][0]).split("%")[0])
    with contextlib.suppress(OSError), socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        for _, name in socket.if_nameindex():
            with contextlib.suppress(OSError):
                packed = struct.pack("256s", name.encode()[:15])
                reply = fcntl.ioctl(sock.fileno(), 0x8915, packed)  # SIOCGIFADDR
                found.add(socket.inet_ntoa(reply[20:24]))
    return found


def _split_host(host: str) -> str:
    """net.SplitHostPort's host, or the whole header when it has no port."""
    if host.startswith("["):
        end = host.find("]")
        if end > 0 and (host[end + 1 :] == "" or host[end + 1 :].startswith(":")):
            return host[1:end]
        return host
    if host.count(":") == 1:
        return host.split(":", 1)[0]
    return host


def listens_on_loopback(bind_host: str) -> bool:
    try:
        return ipaddress.ip_address(bind_host).is_loopback
    except ValueError:
        return bind_host.lower() == "localhost"


class HostGuard:
    """The CORS and Host checks as one aiohttp middleware."""

    def __init__(self, bind_host: str, origins: tuple[str, ...] = ()) -> None:
        self.check_host = listens_on_loopback(bind_host)
        self.origins = allowed_origins(origins)
        self.allow_all = "*" in (o.strip() for o in self.origins)
        self._local_ips = _interface_addresses()
        self._hostname = socket.gethostname().lower()

    def host_allowed(self, header: str) -> bool:
        host = _split_host(header)
        try:
            ip = ipaddress.ip_address(host)
        except ValueError:
            ip = None
        if ip is not None:
            return (
                ip.is_loopback
                or ip.is_private
                or ip.is_unspecified
                or str(ip) in self._local_ips
                or self.name_allowed(host)
            )
        return self.name_allowed(host)

    def name_allowed(self, host: str) -> bool:
        host = host.lower()
        return host in ("", "localhost", self._hostname) or host.endswith(LOCAL_SUFFIXES)

    @staticmethod
    def _cross_origin(request: web.Request) -> str:
        """The request's Origin when it is a CORS request (not its own host), else ""."""
        host = request.headers.get("Host", "")
        origin = request.headers.get("Origin", "")
        return "" if origin in ("", f"http://{host}", f"https://{host}") else origin

    async def _add_cors_headers(self, request: web.Request, response: web.StreamResponse) -> None:
        origin = self._cross_origin(request)
        if not origin or not _origin_allowed(origin, self.origins):
            return
        if self.allow_all:
            response.headers.setdefault("Access-Control-Allow-Origin", "*")
        elif "Access-Control-Allow-Origin" not in response.headers:
            response.headers.add("Vary", "Origin")
            response.headers["Access-Control-Allow-Origin"] = origin

    @web.middleware
    async def check(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        answer = self._judge(request)
        if answer is None:
            return await handler(request)
        # gin sets Allow before the middleware runs on a path other methods serve, so the
        # checks' own answers there carry it.
        exc = request.match_info.http_exception
        if isinstance(exc, web.HTTPMethodNotAllowed):
            answer.headers["Allow"] = ", ".join(
                m for m in GIN_METHOD_ORDER if m in exc.allowed_methods
            )
        return answer

    def _judge(self, request: web.Request) -> web.Response | None:
        """The checks' own answer to a request, or None to route it."""
        host = request.headers.get("Host", "")
        origin = self._cross_origin(request)
        if origin:
            if not _origin_allowed(origin, self.origins):
                return web.Response(status=403)
            if request.method == "OPTIONS":
                return self._preflight(origin)
        if self.check_host and not self.host_allowed(host):
            return web.Response(status=403)
        if self.check_host and request.method == "OPTIONS" and self.name_allowed(_split_host(host)):
            return web.Response(status=204)
        return None

    def _preflight(self, origin: str) -> web.Response:
        """cors handlePreflight, then the origin (or `*`) and 204."""
        headers: CIMultiDict[str] = CIMultiDict(
            [
                ("Access-Control-Allow-Methods", ALLOW_METHODS),
                ("Access-Control-Allow-Headers", ALLOW_HEADERS),
                ("Access-Control-Max-Age", MAX_AGE),
            ]
        )
        if self.allow_all:
            headers["Access-Control-Allow-Origin"] = "*"
        else:
            for vary in PREFLIGHT_VARY:
                headers.add("Vary", vary)
            headers["Access-Control-Allow-Origin"] = origin
        return web.Response(status=204, headers=headers)

    def install(self, app: web.Application) -> None:
        """Put the checks in front of every route of `app`."""
        app.middlewares.append(self.check)
        app.on_response_prepare.append(self._add_cors_headers)
