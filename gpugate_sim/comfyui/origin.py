"""ComfyUI's origin-only middleware (the default) and its permissive CORS alternative."""

from __future__ import annotations

import ipaddress
import logging
import socket
import urllib.parse
from collections.abc import Awaitable, Callable

from aiohttp import web

log = logging.getLogger(__name__)
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def is_loopback(host: str | None) -> bool:
    """True for a loopback IP, or a name every address of which is loopback."""
    if host is None:
        return False
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        pass
    loopback = False
    for family in (socket.AF_INET, socket.AF_INET6):
        try:
            for _, _, _, _, sockaddr in socket.getaddrinfo(host, None, family, socket.SOCK_STREAM):
                if not ipaddress.ip_address(sockaddr[0]).is_loopback:
                    return loopback
                loopback = True
        except socket.gaierror:
            pass
    return loopback


def host_origin_mismatch(host: str, origin: str) -> bool:
    """Upstream's rule: with a loopback Host, Host and Origin netlocs must match."""
    host_domain: str | None = host.lower()
    parsed = urllib.parse.urlparse(origin)
    origin_domain: str | None = parsed.netloc.lower()
    host_parsed = urllib.parse.urlsplit("//" + (host_domain or ""))
    loopback = is_loopback(host_parsed.hostname)
    # Ports are compared only when both sides carry one.
    if parsed.port is None:
        host_domain = host_parsed.hostname
    if host_parsed.port is None:
        origin_domain = parsed.hostname
    if loopback and host_domain and origin_domain and host_domain != origin_domain:
        log.warning(
            "WARNING: request with non matching host and origin %s != %s, returning 403",
            host_domain,
            origin_domain,
        )
        return True
    return False


@web.middleware
async def origin_only(request: web.Request, handler: Handler) -> web.StreamResponse:
    host, origin = request.headers.get("Host"), request.headers.get("Origin")
    if host is not None and origin is not None and host_origin_mismatch(host, origin):
        return web.Response(status=403)
    if request.method == "OPTIONS":
        return web.Response()
    return await handler(request)


def cors(allowed_origin: str) -> Callable[[web.Request, Handler], Awaitable[web.StreamResponse]]:
    """--enable-cors-header: no origin check, CORS headers on every answer."""

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        response = web.Response() if request.method == "OPTIONS" else await handler(request)
        if not response.prepared:
            response.headers["Access-Control-Allow-Origin"] = allowed_origin
            response.headers["Access-Control-Allow-Methods"] = "POST, GET, DELETE, PUT, OPTIONS"
            response.headers["Access-Control-Allow-Headers"] = "Content-Type, Authorization"
            response.headers["Access-Control-Allow-Credentials"] = "true"
        return response

    return middleware
