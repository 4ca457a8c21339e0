"""Ollama's CORS and Host checks, answered by the gate as Ollama at the gate's address would.

The gate sits where Ollama used to listen, so a client must meet the checks of an Ollama
listening there, not those of the loopback Ollama behind the gate (which would see the
gate's own Host and pass everything). The rules follow Ollama's source:

* CORS first (gin-contrib/cors as `GenerateRoutes` configures it: wildcards, the origins of
  `envconfig.AllowedOrigins`): an `Origin` equal to `http(s)://<Host>` is not a CORS
  request; another origin must be allowed, else 403 with an empty body; an allowed preflight
  (OPTIONS) is answered 204 with the allow headers; other allowed requests get
  `Access-Control-Allow-Origin: <origin>` and `Vary: Origin` on whatever the route answers.
* Then `allowedHostsMiddleware`, only when the listener is a loopback address: `Host` must be
  a loopback, private, unspecified or local-interface IP, `localhost`, the machine's
  hostname, or a name under .localhost, .local or .internal, else 403 with an empty body;
  OPTIONS to an allowed host *name* is answered 204 there.

Upstream, the gate sends its own Host (the upstream's address, which the loopback check
behind it accepts) and no Origin: the decision was made here, and the CORS headers the
client's browser checks are added here, naming the client's own origin.
"""

from __future__ import annotations

import contextlib
import ipaddress
import socket
from collections.abc import Mapping

import attrs

from gpugate.runtimes.base import ErrorReply, Screening

ALLOW_METHODS = "GET,POST,PUT,PATCH,DELETE,HEAD,OPTIONS"
ALLOW_HEADERS = ",".join(
    [
        "Authorization",
        "Content-Type",
        "User-Agent",
        "Accept",
        "X-Requested-With",
        # gin-contrib/cors lower-cases, then canonicalises (http.CanonicalHeaderKey).
        "Openai-Beta",
        "X-Stainless-Arch",
        "X-Stainless-Async",
        "X-Stainless-Custom-Poll-Interval",
        "X-Stainless-Helper-Method",
        "X-Stainless-Lang",
        "X-Stainless-Os",
        "X-Stainless-Package-Version",
        "X-Stainless-Poll-Helper",
        "X-Stainless-Retry-Count",
        "X-Stainless-Runtime",
        "X-Stainless-Runtime-Version",
        "X-Stainless-Timeout",
    ]
)
MAX_AGE = str(12 * 3600)
LOCAL_SUFFIXES = (".localhost", ".local", ".internal")
BUILTIN_ORIGINS = tuple(
    [
        f"{scheme}://{host}{port}"
        for host in ("localhost", "127.0.0.1", "0.0.0.0")
        for port in ("", ":*")
        for scheme in ("http", "https")
    ]
    + ["app://*", "file://*", "tauri://*", "vscode-webview://*", "vscode-file://*"]
)

FORBIDDEN = ErrorReply(403, b"", "")
"""gin's AbortWithStatus(403): no body, no Content-Type."""


@attrs.frozen
class OriginRules:
    """gin-contrib/cors's origin matching with Ollama's configuration."""

    exact: frozenset[str]
    wildcards: tuple[tuple[str, str], ...]
    allow_all: bool

    @classmethod
    def build(cls, extra: tuple[str, ...]) -> OriginRules:
        """OLLAMA_ORIGINS (`extra`) plus Ollama's built-in origins, as cors.New reads them."""
        origins = [o.strip().lower() for o in (*extra, *BUILTIN_ORIGINS)]
        wildcards = []
        for origin in origins:
            star = origin.find("*")
            if star < 0 or origin == "*":
                continue
            if star == 0:
                wildcards.append(("*", origin[1:]))
            elif star == len(origin) - 1:
                # cors drops the character before a trailing star ("http://localhost:*"
                # matches every origin that starts with "http://localhost").
                wildcards.append((origin[: star - 1], "*"))
            else:
                wildcards.append((origin[:star], origin[star + 1 :]))
        return cls(frozenset(origins), tuple(wildcards), "*" in origins)

    def allowed(self, origin: str) -> bool:
        if self.allow_all or origin in self.exact:
            return True
        for prefix, suffix in self.wildcards:
            if prefix == "*" and origin.endswith(suffix):
                return True
            if suffix == "*" and origin.startswith(prefix):
                return True
            if origin.startswith(prefix) and origin.endswith(suffix):
                return True
        return False


def split_host(host: str) -> str:
    """net.SplitHostPort's host, or the whole header when it has no port."""
    if host.startswith("["):
        end = host.find("]")
        if end > 0 and host[end + 1 :].startswith(":"):
            return host[1:end]
        return host
    if host.count(":") == 1:
        return host.split(":", 1)[0]
    return host


def is_loopback_listener(host: str) -> bool:
    """Whether a listener on `host` gets Ollama's host check (a loopback address)."""
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return host.lower() == "localhost"


def _local_addresses() -> frozenset[str]:
    found: set[str] = set()
    with contextlib.suppress(OSError):
        for info in socket.getaddrinfo(socket.gethostname(), None):
            found.add(str(info[4][0]).split("%")[0])
    with contextlib.suppress(OSError):
        for _, name in socket.if_nameindex():
            with contextlib.suppress(OSError):
                for info in socket.getaddrinfo(name, None):
                    found.add(str(info[4][0]).split("%")[0])
    return frozenset(found)


SEEN_LIMIT = 4096
"""Distinct (method, Host, Origin) answers remembered per listener."""


class OllamaHostCheck:
    """Ollama's CORS and Host checks for a listener on `listen_host`."""

    def __init__(self, listen_host: str, origins: tuple[str, ...] = ()) -> None:
        self.check_host = is_loopback_listener(listen_host)
        self.origins = OriginRules.build(origins)
        self._hostname = socket.gethostname().lower()
        self._local: frozenset[str] | None = None
        self._seen: dict[tuple[str, str, str], Screening] = {}

    def _is_local_ip(self, ip: str) -> bool:
        if self._local is None:
            self._local = _local_addresses()
        return ip in self._local

    def name_allowed(self, host: str) -> bool:
        host = host.lower()
        return host in ("", "localhost", self._hostname) or host.endswith(LOCAL_SUFFIXES)

    def host_allowed(self, host: str) -> bool:
        try:
            ip = ipaddress.ip_address(host)
        except ValueError:
            return self.name_allowed(host)
        if ip.is_loopback or ip.is_private or ip.is_unspecified or self._is_local_ip(str(ip)):
            return True
        return self.name_allowed(host)

    def screen(self, method: str, headers: Mapping[str, str]) -> Screening:
        """What Ollama at the listener would do before routing this request."""
        host = headers.get("Host", "")
        origin = headers.get("Origin", "")
        # The answer depends on these three alone, and a host sees few distinct ones; a
        # client sending a new Host each time only fills a bounded table.
        key = (method, host, origin)
        screening = self._seen.get(key)
        if screening is None:
            screening = self._screen(method, host, origin)
            if len(self._seen) < SEEN_LIMIT:
                self._seen[key] = screening
        return screening

    def _screen(self, method: str, host: str, origin: str) -> Screening:
        cors: tuple[tuple[str, str], ...] = ()
        if origin and origin not in (f"http://{host}", f"https://{host}"):
            if not self.origins.allowed(origin):
                return Screening(reply=FORBIDDEN, drop_up=("Origin",))
            if self.origins.allow_all:
                cors = (("Access-Control-Allow-Origin", "*"),)
            else:
                cors = (("Vary", "Origin"), ("Access-Control-Allow-Origin", origin))
            if method == "OPTIONS":
                return Screening(reply=self._preflight(origin), drop_up=("Origin",))
        if self.check_host:
            name = split_host(host)
            if not self.host_allowed(name):
                return Screening(reply=attrs.evolve(FORBIDDEN, headers=cors), drop_up=("Origin",))
            if method == "OPTIONS" and self._is_name(name) and self.name_allowed(name):
                reply = ErrorReply(204, b"", "", headers=cors)
                return Screening(reply=reply, drop_up=("Origin",))
        return Screening(response_headers=cors, drop_up=("Origin",))

    @staticmethod
    def _is_name(host: str) -> bool:
        try:
            ipaddress.ip_address(host)
        except ValueError:
            return True
        return False

    def _preflight(self, origin: str) -> ErrorReply:
        headers: tuple[tuple[str, str], ...] = (
            ("Access-Control-Allow-Methods", ALLOW_METHODS),
            ("Access-Control-Allow-Headers", ALLOW_HEADERS),
            ("Access-Control-Max-Age", MAX_AGE),
        )
        if self.origins.allow_all:
            headers += (("Access-Control-Allow-Origin", "*"),)
        else:
            headers += (
                ("Vary", "Origin"),
                ("Vary", "Access-Control-Request-Method"),
                ("Vary", "Access-Control-Request-Headers"),
                ("Access-Control-Allow-Origin", origin),
            )
        return ErrorReply(204, b"", "", headers=headers)
