"""Bearer tokens on the control API.

Every route that changes state (any method but GET, HEAD and OPTIONS) needs a token, on
any address. A control token (`gate.control_tokens`) may do what its scopes allow (a bare
entry: everything); each route needs one scope (ROUTE_SCOPES, `required_scopes`), and a
known token without it is answered 403 naming the scope (401 stays for no token or an
unknown one). An identity's own token (`identities[].tokens`) may hold explicit leases as
that identity and nothing else. Read-only routes and /metrics are public when
`gate.control_public` says so (by default: when the control listener is on loopback);
otherwise they need the `read` scope. Tokens are compared in constant time.

A control listener on loopback also refuses a request whose Host is not a local name or
address (403, empty): a page that rebinds its own DNS name to 127.0.0.1 reaches the listener
from the browser, but names itself in Host, so it cannot read status or events.
"""

from __future__ import annotations

import hmac
import ipaddress
import logging
import socket
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING

import attrs
from aiohttp import web

from gpugate.config.model import Scope, token_scopes
from gpugate.control.bodies import BadRequest, json_body

if TYPE_CHECKING:
    from gpugate.config.model import Config

log = logging.getLogger(__name__)

READ_ONLY = frozenset({"GET", "HEAD", "OPTIONS"})
LEASE_ROUTES = "/gate/v1/leases"

ASK_LEASE = ("POST", "/gate/v1/leases")
"""Asks for an explicit lease (`lease`), or with `"purpose": "start"` a start lease (`admit`)."""
ROUTE_SCOPES: Mapping[tuple[str, str], Scope] = {
    ASK_LEASE: Scope.LEASE,
    ("POST", "/gate/v1/leases/{id}/renew"): Scope.LEASE,
    ("DELETE", "/gate/v1/leases/{id}"): Scope.LEASE,
    ("POST", "/gate/v1/residents/{consumer}/{model}/evict"): Scope.OPERATE,
    ("POST", "/gate/v1/consumers/{name}/drain"): Scope.OPERATE,
    ("POST", "/gate/v1/consumers/{name}/undrain"): Scope.OPERATE,
    ("POST", "/gate/v1/gpus/{index}/pause"): Scope.OPERATE,
    ("POST", "/gate/v1/gpus/{index}/resume"): Scope.OPERATE,
}
"""The scope each state-changing route needs, by method and route pattern. Every read-only
route needs `read` (when reads are not public); a write route missing here needs `operate`."""


def required_scopes(method: str, route: str) -> tuple[Scope, ...]:
    """The scopes of which a control token needs one for `method` on the route pattern
    `route` (`/gate/v1/leases/{id}`), before the request's body is known."""
    if method in READ_ONLY:
        return (Scope.READ,)
    if (method, route) == ASK_LEASE:
        return (Scope.LEASE, Scope.ADMIT)
    return (ROUTE_SCOPES.get((method, route), Scope.OPERATE),)


@attrs.frozen
class Caller:
    """Who a control request is from, by the token it presented."""

    admin: bool = False
    """A control token: every consumer and identity, on the routes its scopes allow."""
    identity: str | None = None
    """An identity's token: explicit leases as that identity only."""
    scopes: frozenset[Scope] = frozenset()
    """A control token's scopes: those of every `control_tokens` entry it matches."""


CALLER = web.RequestKey("caller", Caller)
"""Where the middleware leaves the `Caller` for handlers (on the request)."""


def presented(request: web.Request) -> str | None:
    """The bearer token of the request, if any."""
    header = request.headers.get("Authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        return None
    return token.strip()


def readable(token: str) -> bool:
    """Whether a presented token is text at all.

    Header bytes that are not UTF-8 reach the app as lone surrogates; such a token can
    match no configured one (those are text), and it cannot even be encoded to compare.
    """
    try:
        token.encode()
    except UnicodeEncodeError:
        return False
    return True


class Throttle:
    """Lets one log line through per `interval` seconds; the others are counted."""

    def __init__(self, interval: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.interval = interval
        self.clock = clock
        self._next = 0.0
        self.suppressed = 0

    def allow(self) -> bool:
        now = self.clock()
        if now < self._next:
            self.suppressed += 1
            return False
        self._next = now + self.interval
        return True


UNREADABLE_LOG_INTERVAL = 60.0
"""At most one warning about unreadable tokens per this many seconds."""


# -- Host on a loopback listener -----------------------------------------------------------

LOCAL_SUFFIXES = (".localhost", ".local", ".internal")
PRIVATE_NETWORKS = tuple(
    ipaddress.ip_network(n) for n in ("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "fc00::/7")
)
"""Go's netip IsPrivate (RFC 1918, RFC 4193): narrower than Python's `is_private`."""


def _split_host(host: str) -> str:
    """net.SplitHostPort's host, or the whole value when it has no port."""
    if host.startswith("["):
        end = host.find("]")
        if end > 0 and host[end + 1 :].startswith(":"):
            return host[1:end]
        return host
    return host.split(":", 1)[0] if host.count(":") == 1 else host


def _ip_allowed(ip: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
    if ip.is_unspecified:
        return True
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    if isinstance(ip, ipaddress.IPv4Address):
        return ip.packed[0] == 127 or any(ip in net for net in PRIVATE_NETWORKS[:3])
    return ip == ipaddress.IPv6Address("::1") or ip in PRIVATE_NETWORKS[3]


class HostRule:
    """The DNS-rebinding rule the local runtimes apply on a loopback listener.

    Host (its port aside) must be a loopback, private (RFC 1918/4193), unspecified or
    local-interface address, or `localhost`, this machine's hostname, or a name under
    .localhost, .local or .internal; an absent Host passes.
    """

    def __init__(self) -> None:
        self._hostname = socket.gethostname().lower()
        self._local: frozenset[str] | None = None

    def _local_addresses(self) -> frozenset[str]:
        if self._local is None:
            found: set[str] = set()
            try:
                for info in socket.getaddrinfo(socket.gethostname(), None):
                    found.add(str(info[4][0]).split("%")[0])
            except OSError:
                pass
            self._local = frozenset(found)
        return self._local

    def allows(self, header: str) -> bool:
        host = _split_host(header)
        try:
            ip = ipaddress.ip_address(host)
        except ValueError:
            ip = None
        if ip is not None and (_ip_allowed(ip) or str(ip) in self._local_addresses()):
            return True
        name = host.lower()
        return name in ("", "localhost", self._hostname) or name.endswith(LOCAL_SUFFIXES)


def on_loopback(config: Config) -> bool:
    """Whether the control listener is on a loopback address."""
    host = config.gate.control.host
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _matches(token: str, candidates: tuple[str, ...]) -> bool:
    # Every candidate is compared, so the time taken does not tell which one came close.
    encoded = token.encode()
    found = False
    for candidate in candidates:
        found |= hmac.compare_digest(encoded, candidate.encode())
    return found


def _granted(token: str, candidates: tuple[str, ...]) -> frozenset[Scope]:
    """The scopes of every control token `token` is (none: it is none of them)."""
    encoded = token.encode()
    granted: frozenset[Scope] = frozenset()
    for candidate in candidates:
        # Every candidate is compared, as in _matches.
        same = hmac.compare_digest(encoded, candidate.encode())
        granted |= token_scopes(candidate) if same else frozenset()
    return granted


def caller_of(token: str | None, config: Config) -> Caller | None:
    """The caller a token makes; None when it is no token the configuration knows."""
    if token is None:
        return None
    scopes = _granted(token, config.gate.control_tokens)
    if scopes:
        return Caller(admin=True, scopes=scopes)
    for identity in config.identities:
        if _matches(token, identity.tokens):
            return Caller(identity=identity.name)
    return None


def reads_are_public(config: Config) -> bool:
    """Whether GET routes and /metrics answer without a token."""
    if config.gate.control_public is not None:
        return config.gate.control_public
    return on_loopback(config)


def refused(message: str) -> web.Response:
    """401 with the challenge a client needs to know a bearer token is wanted."""
    return web.json_response(
        {"error": {"class": "UNAUTHORIZED", "message": message}},
        status=401,
        headers={"WWW-Authenticate": 'Bearer realm="gpugate"'},
    )


def forbidden(needed: tuple[Scope, ...], held: frozenset[Scope], what: str) -> web.Response:
    """403 in the control API's error shape: the token is known, but lacks the scope."""
    names = " or ".join(f"'{scope.value}'" for scope in needed)
    has = ", ".join(sorted(scope.value for scope in held)) or "none"
    message = f"this token's scopes ({has}) do not include {names}, which {what} needs"
    challenge = (
        'Bearer realm="gpugate", error="insufficient_scope", '
        f'scope="{" ".join(scope.value for scope in needed)}"'
    )
    return web.json_response(
        {"error": {"class": "FORBIDDEN", "message": message}},
        status=403,
        headers={"WWW-Authenticate": challenge},
    )


async def _purpose(request: web.Request) -> str | None:
    """A lease request's `purpose` (default `hold`); None when the body is not an object.

    The body is read here and kept for the handler (gpugate.control.bodies.json_body).
    """
    try:
        body = await json_body(request)
    except BadRequest:
        return None
    if not isinstance(body, dict):
        return None
    purpose = body.get("purpose", "hold")
    return purpose if isinstance(purpose, str) else None


async def needed_scopes(request: web.Request) -> tuple[tuple[Scope, ...], str] | None:
    """The scopes of which the request needs one, and the route as a message names it;
    None for a request no route answers (aiohttp's 404 or 405 follows)."""
    match = request.match_info
    if match.http_exception is not None:
        return None
    resource = match.route.resource
    route = resource.canonical if resource is not None else request.path
    what = f"{request.method} {route}"
    needed = required_scopes(request.method, route)
    if (request.method, route) == ASK_LEASE:
        purpose = await _purpose(request)
        if purpose == "start":
            return (Scope.ADMIT,), f'{what} with "purpose": "start"'
        if purpose == "hold":
            return (Scope.LEASE,), what
        # Not a lease request the handler can read: its 400 says why, to either scope.
    return needed, what


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def token_middleware(config: Callable[[], Config]) -> Callable[..., Awaitable[web.StreamResponse]]:
    """The middleware guarding the control app; `config` gives the running configuration."""

    hosts = HostRule()
    throttle = Throttle(UNREADABLE_LOG_INTERVAL)

    @web.middleware
    async def guard(request: web.Request, handler: Handler) -> web.StreamResponse:
        current = config()
        if on_loopback(current):
            # request.host is the absolute-form target's host when the client sent one.
            named = {request.headers.get("Host", ""), request.host}
            if not all(hosts.allows(host) for host in named):
                return web.Response(status=403)
        token = presented(request)
        if token is not None and not readable(token):
            if throttle.allow():
                log.warning(
                    "control request from %s with a bearer token that is not UTF-8 text "
                    "(%d more since the last such warning)",
                    request.remote,
                    throttle.suppressed,
                )
                throttle.suppressed = 0
            caller = None
        else:
            caller = caller_of(token, current)
        writes = request.method not in READ_ONLY
        if writes or not reads_are_public(current):
            if token is None:
                return refused("this route needs a bearer token (Authorization: Bearer ...)")
            if caller is None:
                return refused("the bearer token is not valid here")
            if not caller.admin and not request.path.startswith(LEASE_ROUTES):
                return refused("an identity's token may only hold explicit leases")
            if caller.admin:
                found = await needed_scopes(request)
                if found is not None and not caller.scopes.intersection(found[0]):
                    return forbidden(found[0], caller.scopes, found[1])
        request[CALLER] = caller if caller is not None else Caller()
        return await handler(request)

    return guard
