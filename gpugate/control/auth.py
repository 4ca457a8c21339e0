"""Bearer tokens on the control API.

Every route that changes state (any method but GET, HEAD and OPTIONS) needs a token, on
any address. A control token (`gate.control_tokens`) may do everything; an identity's own
token (`identities[].tokens`) may hold explicit leases as that identity and nothing else.
Read-only routes and /metrics are public when `gate.control_public` says so (by default:
when the control listener is on loopback). Tokens are compared in constant time.
"""

from __future__ import annotations

import hmac
import ipaddress
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

import attrs
from aiohttp import web

if TYPE_CHECKING:
    from gpugate.config.model import Config

READ_ONLY = frozenset({"GET", "HEAD", "OPTIONS"})
LEASE_ROUTES = "/gate/v1/leases"


@attrs.frozen
class Caller:
    """Who a control request is from, by the token it presented."""

    admin: bool = False
    """A control token: every route, every consumer and identity."""
    identity: str | None = None
    """An identity's token: explicit leases as that identity only."""


CALLER = web.RequestKey("caller", Caller)
"""Where the middleware leaves the `Caller` for handlers (on the request)."""


def presented(request: web.Request) -> str | None:
    """The bearer token of the request, if any."""
    header = request.headers.get("Authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        return None
    return token.strip()


def _matches(token: str, candidates: tuple[str, ...]) -> bool:
    # Every candidate is compared, so the time taken does not tell which one came close.
    encoded = token.encode()
    found = False
    for candidate in candidates:
        found |= hmac.compare_digest(encoded, candidate.encode())
    return found


def caller_of(token: str | None, config: Config) -> Caller | None:
    """The caller a token makes; None when it is no token the configuration knows."""
    if token is None:
        return None
    if _matches(token, config.gate.control_tokens):
        return Caller(admin=True)
    for identity in config.identities:
        if _matches(token, identity.tokens):
            return Caller(identity=identity.name)
    return None


def reads_are_public(config: Config) -> bool:
    """Whether GET routes and /metrics answer without a token."""
    if config.gate.control_public is not None:
        return config.gate.control_public
    host = config.gate.control.host
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def refused(message: str) -> web.Response:
    """401 with the challenge a client needs to know a bearer token is wanted."""
    return web.json_response(
        {"error": {"class": "UNAUTHORIZED", "message": message}},
        status=401,
        headers={"WWW-Authenticate": 'Bearer realm="gpugate"'},
    )


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def token_middleware(config: Callable[[], Config]) -> Callable[..., Awaitable[web.StreamResponse]]:
    """The middleware guarding the control app; `config` gives the running configuration."""

    @web.middleware
    async def guard(request: web.Request, handler: Handler) -> web.StreamResponse:
        current = config()
        token = presented(request)
        caller = caller_of(token, current)
        writes = request.method not in READ_ONLY
        if writes or not reads_are_public(current):
            if token is None:
                return refused("this route needs a bearer token (Authorization: Bearer ...)")
            if caller is None:
                return refused("the bearer token is not valid here")
            if not caller.admin and not request.path.startswith(LEASE_ROUTES):
                return refused("an identity's token may only hold explicit leases")
        request[CALLER] = caller if caller is not None else Caller()
        return await handler(request)

    return guard
