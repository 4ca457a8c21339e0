"""Ollama's CORS and Host checks, answered by the gate as Ollama at the gate's address would.

The gate sits where Ollama used to listen, so a client must meet the checks of an Ollama
listening there, not those of the loopback Ollama behind the gate (which would see the
gate's own Host and pass everything). The rules follow Ollama v0.24.0's source:

* The Host is Go's `Request.Host`: the authority of an absolute-form request-target
  (`GET http://evil.example/api/tags`) when it has one, else the Host header (net/http
  `readRequest`). A target Go cannot parse is answered 400 before any handler.
* CORS first (gin-contrib/cors v1.7.2 as `GenerateRoutes` configures it, server/routes.go
  1678-1710): an `Origin` equal to `http(s)://<Host>` is not a CORS request; another origin
  must be allowed (`OriginRules`), else 403 with an empty body; an allowed preflight
  (OPTIONS) is answered 204 with the preflight headers; other allowed requests get
  `Vary: Origin` and `Access-Control-Allow-Origin` on whatever the route answers.
* Then `allowedHostsMiddleware` (routes.go 1639-1675), only when the listener is a loopback
  address: `Host` must be a loopback, private, unspecified or local-interface IP,
  `localhost`, the machine's hostname, or a name under .localhost, .local or .internal,
  else 403 with an empty body; OPTIONS to an allowed host *name* is answered 204 there.
* Both run as gin middleware, also for a path no route of the method serves: there gin has
  already set `Allow` (gin v1.10.0 gin.go 649-666, HandleMethodNotAllowed), so a refusal or
  a preflight on such a path carries it.

Upstream, the gate sends its own Host (the upstream's address, which the loopback check
behind it accepts) and no Origin: the decision was made here, and the CORS headers the
client's browser checks are added here, naming the client's own origin. An absolute-form
target goes up as sent (Ollama's `Request.RequestURI` is the client's), so the Host Go
takes from it is the client's: one the loopback check would refuse (the gate's listener,
not loopback, checked none) goes up in origin form instead (`Screening.target_as_sent`).
"""

from __future__ import annotations

import contextlib
import ipaddress
import socket
from collections.abc import Mapping

import attrs

from gpugate.runtimes.base import ErrorReply, Screening
from gpugate.runtimes.ollama.gotarget import BadTarget, GoTarget, parse_target

ALLOW_METHODS = "GET,POST,PUT,PATCH,DELETE,HEAD,OPTIONS"
"""cors.DefaultConfig's AllowMethods, normalised and upper-cased (utils.go 34-38)."""
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
        # envconfig.AllowedOrigins (envconfig/config.go 86-109): net.JoinHostPort(h, "*").
        f"{scheme}://{host}{port}"
        for host in ("localhost", "127.0.0.1", "0.0.0.0")
        for port in ("", ":*")
        for scheme in ("http", "https")
    ]
    + ["app://*", "file://*", "tauri://*", "vscode-webview://*", "vscode-file://*"]
)
ORIGIN_SCHEMES = (
    # cors DefaultSchemas + ExtensionSchemas (config.go 23-32): Ollama sets
    # AllowBrowserExtensions, not AllowWebSockets, AllowFiles or CustomSchemas.
    "http://",
    "https://",
    "chrome-extension://",
    "safari-extension://",
    "moz-extension://",
    "ms-browser-extension://",
)

FORBIDDEN = ErrorReply(403, b"", "")
"""gin's AbortWithStatus(403): no body, no Content-Type."""
BAD_REQUEST = ErrorReply(
    400, b"400 Bad Request", "text/plain; charset=utf-8", headers=(("Connection", "close"),)
)
"""net/http's answer to a request line it cannot parse (server.go: `400 Bad Request`)."""


def origin_problem(origin: str) -> str | None:
    """Why cors.New would panic on this OLLAMA_ORIGINS entry (Ollama would not start), if so.

    cors.go `Validate` 135-139 and `parseWildcardRules` 155-157, on the entry as written.
    """
    stars = origin.count("*")
    if stars > 1:
        return "only one * is allowed"
    if stars == 0 and not origin.startswith(ORIGIN_SCHEMES):
        return "origins must contain '*' or start with " + ", ".join(ORIGIN_SCHEMES)
    return None


def ollama_origins(extra: tuple[str, ...]) -> tuple[str, ...]:
    """envconfig.AllowedOrigins with `extra` as OLLAMA_ORIGINS.

    `extra` is the list OLLAMA_ORIGINS would hold joined by commas; `envconfig.Var` trims
    spaces and quotes off the whole value, then it is split at every comma.
    """
    value = ",".join(extra).strip().strip("\"'")
    return (*(value.split(",") if value else ()), *BUILTIN_ORIGINS)


@attrs.frozen
class Wildcard:
    """One `*` rule of cors `parseWildcardRules` (cors.go 143-173)."""

    prefix: str
    """The text before the `*` ("*" when the star opens the pattern)."""
    suffix: str
    """The text after the `*` ("*" when the star ends the pattern)."""

    @classmethod
    def parse(cls, origin: str) -> Wildcard:
        star = origin.index("*")
        if star == 0:
            return cls("*", origin[1:])
        if star == len(origin) - 1:
            return cls(origin[:star], "*")
        return cls(origin[:star], origin[star + 1 :])

    def matches(self, origin: str) -> bool:
        """validateWildcardOrigin (config.go 101-115), one rule."""
        if self.prefix == "*" and origin.endswith(self.suffix):
            return True
        if self.suffix == "*" and origin.startswith(self.prefix):
            return True
        return origin.startswith(self.prefix) and origin.endswith(self.suffix)


@attrs.frozen
class OriginRules:
    """gin-contrib/cors v1.7.2's origin matching with Ollama's configuration.

    Exact entries are compared after `normalize` (trimmed, lower-cased: utils.go 67-82);
    wildcard rules are taken from the entries as written; the request's Origin is compared
    as sent, never lower-cased (config.go 125-141).
    """

    exact: frozenset[str]
    wildcards: tuple[Wildcard, ...]
    allow_all: bool

    @classmethod
    def build(cls, extra: tuple[str, ...]) -> OriginRules:
        """OLLAMA_ORIGINS (`extra`) plus Ollama's built-in origins, as cors.New reads them.

        An entry cors.New would panic on is left out: that Ollama never starts, so nothing
        could have been allowed by it (the configuration check reports it).
        """
        origins = [o for o in ollama_origins(extra) if origin_problem(o) is None]
        return cls(
            frozenset(o.strip().lower() for o in origins),
            tuple(Wildcard.parse(o) for o in origins if "*" in o),
            # newCors: an entry equal to "*" (as written) allows all (config.go 47-51).
            "*" in origins,
        )

    def allowed(self, origin: str) -> bool:
        if self.allow_all or origin in self.exact:
            return True
        return any(rule.matches(origin) for rule in self.wildcards)


# -- gin's routes, for the Allow header ------------------------------------------------------

ROUTES: tuple[tuple[str, str], ...] = (
    # GenerateRoutes (server/routes.go 1713-1765), in registration order.
    ("HEAD", "/"),
    ("GET", "/"),
    ("HEAD", "/api/version"),
    ("GET", "/api/version"),
    ("GET", "/api/status"),
    ("POST", "/api/pull"),
    ("POST", "/api/push"),
    ("HEAD", "/api/tags"),
    ("GET", "/api/tags"),
    ("POST", "/api/show"),
    ("DELETE", "/api/delete"),
    ("POST", "/api/me"),
    ("POST", "/api/signout"),
    ("DELETE", "/api/user/keys/:encodedKey"),
    ("POST", "/api/create"),
    ("POST", "/api/blobs/:digest"),
    ("HEAD", "/api/blobs/:digest"),
    ("POST", "/api/copy"),
    ("POST", "/api/experimental/web_search"),
    ("POST", "/api/experimental/web_fetch"),
    ("GET", "/api/experimental/model-recommendations"),
    ("GET", "/api/ps"),
    ("POST", "/api/generate"),
    ("POST", "/api/chat"),
    ("POST", "/api/embed"),
    ("POST", "/api/embeddings"),
    ("POST", "/v1/chat/completions"),
    ("POST", "/v1/completions"),
    ("POST", "/v1/embeddings"),
    ("GET", "/v1/models"),
    ("GET", "/v1/models/:model"),
    ("POST", "/v1/responses"),
    ("POST", "/v1/images/generations"),
    ("POST", "/v1/images/edits"),
    ("POST", "/v1/audio/transcriptions"),
    ("POST", "/v1/messages"),
)
TREES = tuple(dict.fromkeys(method for method, _ in ROUTES))
"""gin's method trees in the order they were made (HEAD, GET, POST, DELETE)."""


def _route_matches(pattern: str, path: str) -> bool:
    if ":" not in pattern:
        return pattern == path
    want, got = pattern.split("/"), path.split("/")
    return len(want) == len(got) and all(
        w == g or (w.startswith(":") and g != "") for w, g in zip(want, got, strict=True)
    )


def allow_header(method: str, path: str) -> str:
    """The `Allow` gin sets before a 405 (the other methods' trees serving `path`), or ""."""
    if not path or any(m == method and _route_matches(p, path) for m, p in ROUTES):
        return ""
    allowed = [
        tree
        for tree in TREES
        if tree != method and any(m == tree and _route_matches(p, path) for m, p in ROUTES)
    ]
    return ", ".join(allowed)


def go_order(headers: tuple[tuple[str, str], ...]) -> tuple[tuple[str, str], ...]:
    """Headers in the order net/http writes them: by name, values of a name in order."""
    return tuple(sorted(headers, key=lambda pair: pair[0]))


# -- Host ------------------------------------------------------------------------------------


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


PRIVATE_NETWORKS = tuple(
    ipaddress.ip_network(n) for n in ("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "fc00::/7")
)
"""netip.Addr.IsPrivate (RFC 1918, RFC 4193): narrower than Python's `is_private`."""


def go_ip_allowed(ip: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
    """netip's IsLoopback, IsPrivate and IsUnspecified, as allowedHostsMiddleware asks them."""
    if ip.is_unspecified:
        return True
    # IsLoopback and IsPrivate see an IPv4-mapped IPv6 address as its IPv4 address.
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    if isinstance(ip, ipaddress.IPv4Address):
        return ip.packed[0] == 127 or any(ip in net for net in PRIVATE_NETWORKS[:3])
    return ip == ipaddress.IPv6Address("::1") or ip in PRIVATE_NETWORKS[3]


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
        """allowedHost (routes.go 1612-1637)."""
        host = host.lower()
        return host in ("", "localhost", self._hostname) or host.endswith(LOCAL_SUFFIXES)

    def host_allowed(self, host: str) -> bool:
        try:
            ip = ipaddress.ip_address(host)
        except ValueError:
            return self.name_allowed(host)
        if go_ip_allowed(ip) or self._is_local_ip(str(ip)):
            return True
        return self.name_allowed(host)

    def screen(self, method: str, headers: Mapping[str, str], *, target: str = "") -> Screening:
        """What Ollama at the listener would do before routing this request."""
        try:
            parsed = parse_target(target) if target else GoTarget("", "")
        except BadTarget:
            return Screening(reply=BAD_REQUEST, drop_up=("Origin",))
        # readRequest: `req.Host = req.URL.Host`, the Host header only when that is empty.
        host = parsed.host or headers.get("Host", "")
        origin = headers.get("Origin", "")
        # The answer depends on these three alone, and a host sees few distinct ones; a
        # client sending a new Host each time only fills a bounded table.
        key = (method, host, origin)
        screening = self._seen.get(key)
        if screening is None:
            screening = self._screen(method, host, origin)
            if len(self._seen) < SEEN_LIMIT:
                self._seen[key] = screening
        if parsed.host and screening.reply is None and not self.host_allowed(split_host(host)):
            # Served here (a listener that is not loopback checks no Host), but Go takes the
            # target's authority as the Host, and the loopback Ollama behind the gate checks
            # it: the target goes up in origin form, with the gate's own Host.
            screening = attrs.evolve(screening, target_as_sent=False)
        if screening.reply is not None:
            allow = allow_header(method, parsed.path)
            if allow:
                reply = screening.reply
                headers_out = go_order((*reply.headers, ("Allow", allow)))
                screening = attrs.evolve(screening, reply=attrs.evolve(reply, headers=headers_out))
        return screening

    def _screen(self, method: str, host: str, origin: str) -> Screening:
        cors: tuple[tuple[str, str], ...] = ()
        # cors applyCors (config.go 70-99): compared as sent, against the Go Host.
        if origin and origin not in (f"http://{host}", f"https://{host}"):
            if not self.origins.allowed(origin):
                return Screening(reply=FORBIDDEN, drop_up=("Origin",))
            if method == "OPTIONS":
                return Screening(reply=self._preflight(origin), drop_up=("Origin",))
            if self.origins.allow_all:
                cors = (("Access-Control-Allow-Origin", "*"),)
            else:
                cors = (("Access-Control-Allow-Origin", origin), ("Vary", "Origin"))
        if self.check_host:
            name = split_host(host)
            if not self.host_allowed(name):
                return Screening(reply=attrs.evolve(FORBIDDEN, headers=cors), drop_up=("Origin",))
            if method == "OPTIONS" and self._is_name(name) and self.name_allowed(name):
                reply = ErrorReply(204, b"", "", headers=cors)
                return Screening(reply=reply, drop_up=("Origin",))
        return Screening(response_headers=cors, reply_headers=cors, drop_up=("Origin",))

    @staticmethod
    def _is_name(host: str) -> bool:
        try:
            ipaddress.ip_address(host)
        except ValueError:
            return True
        return False

    def _preflight(self, origin: str) -> ErrorReply:
        """handlePreflight (config.go 143-148, utils.go 29-65), the origin, then 204."""
        headers: tuple[tuple[str, str], ...] = (
            ("Access-Control-Allow-Headers", ALLOW_HEADERS),
            ("Access-Control-Allow-Methods", ALLOW_METHODS),
            ("Access-Control-Max-Age", MAX_AGE),
        )
        if self.origins.allow_all:
            headers += (("Access-Control-Allow-Origin", "*"),)
        else:
            headers += (
                ("Access-Control-Allow-Origin", origin),
                ("Vary", "Origin"),
                ("Vary", "Access-Control-Request-Method"),
                ("Vary", "Access-Control-Request-Headers"),
            )
        return ErrorReply(204, b"", "", headers=go_order(headers))
