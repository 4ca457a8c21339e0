"""ComfyUI's origin check (`server.py` `create_origin_only_middleware`), as the gate runs it
where it listens.

When the `Host`'s hostname is loopback (an IP, or a name every address of which is
loopback) and an `Origin` is present, their netlocs must match, ports compared only when
both carry one; the scheme is ignored (runtime-contracts §2.6, §6).
"""

from __future__ import annotations

import ipaddress
import socket
import urllib.parse

NAME_CACHE_LIMIT = 256
_names: dict[str, bool] = {}


def is_loopback(host: str | None) -> bool:
    """True for a loopback IP, or a name every address of which is loopback."""
    if not host:
        return False
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        pass
    cached = _names.get(host)
    if cached is None:
        cached = _resolve_loopback(host)
        if len(_names) < NAME_CACHE_LIMIT:
            _names[host] = cached
    return cached


def _resolve_loopback(host: str) -> bool:
    loopback = False
    for family in (socket.AF_INET, socket.AF_INET6):
        try:
            infos = socket.getaddrinfo(host, None, family, socket.SOCK_STREAM)
        except (socket.gaierror, UnicodeError):
            continue
        for *_, sockaddr in infos:
            if not ipaddress.ip_address(sockaddr[0]).is_loopback:
                return False
            loopback = True
    return loopback


def host_origin_mismatch(host: str, origin: str) -> bool:
    """Whether ComfyUI refuses a request with these Host and Origin headers (403)."""
    try:
        parsed = urllib.parse.urlparse(origin)
        host_parsed = urllib.parse.urlsplit("//" + host.lower())
        origin_port, host_port = parsed.port, host_parsed.port
    except ValueError:
        return False
    host_domain: str | None = host.lower()
    origin_domain: str | None = parsed.netloc.lower()
    if origin_port is None:
        host_domain = host_parsed.hostname
    if host_port is None:
        origin_domain = parsed.hostname
    loopback = is_loopback(host_parsed.hostname)
    return bool(loopback and host_domain and origin_domain and host_domain != origin_domain)
