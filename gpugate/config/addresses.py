"""Addresses in consumers.yaml: a listener's `host:port` and a runtime's upstream URL."""

from __future__ import annotations

import ipaddress
import re
from urllib.parse import urlsplit

import attrs

_LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
_HOSTNAME = re.compile(rf"{_LABEL}(?:\.{_LABEL})*")


def _check_host(host: str, written: object) -> str:
    """`host` if it is an IP address or a DNS name, else ValueError quoting `written`."""
    try:
        return str(ipaddress.ip_address(host))
    except ValueError:
        pass
    if host.replace(".", "").isdigit() or not _HOSTNAME.fullmatch(host):
        raise ValueError(f"{host!r} in {written!r} is not an IP address or host name")
    return host


def _check_port(port: object, written: object) -> int:
    if isinstance(port, str):
        if not (port.isascii() and port.isdigit()):
            raise ValueError(f"expected a port number in {written!r}, got {port!r}")
        port = int(port)
    if not isinstance(port, int) or not 1 <= port <= 65535:
        raise ValueError(f"port {port} in {written!r} is outside 1-65535")
    return port


@attrs.frozen
class Address:
    """A listen address: "0.0.0.0:11434", "127.0.0.1:9411", "[::1]:8188" or ":8188"."""

    host: str
    port: int

    def __str__(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"

    @classmethod
    def parse(cls, value: str | int) -> Address:
        """Read "host:port", "[v6]:port", ":port" or a bare port (all interfaces: 0.0.0.0)."""
        if isinstance(value, int) and not isinstance(value, bool):
            return cls("0.0.0.0", _check_port(value, value))
        text = value.strip()
        host, colon, port = text.rpartition(":")
        if not colon and not text.isdigit():
            raise ValueError(f"expected an address like '0.0.0.0:11434', got {value!r}")
        if host.startswith("[") and host.endswith("]"):
            host = host[1:-1]
            if ":" not in host:
                raise ValueError(f"brackets are for IPv6 addresses, got {value!r}")
        elif ":" in host:
            raise ValueError(f"write an IPv6 address in brackets, like '[::1]:8188', got {value!r}")
        port_number = _check_port(port, value)
        return cls(_check_host(host, value) if host else "0.0.0.0", port_number)

    @property
    def reaches_loopback(self) -> bool:
        """Whether a connection to 127.0.0.1 (or ::1) on this port lands on this listener."""
        if self.host in ("0.0.0.0", "::", "localhost"):
            return True
        try:
            return ipaddress.ip_address(self.host).is_loopback
        except ValueError:
            return False


@attrs.frozen
class Upstream:
    """Where the real runtime listens: "http://127.0.0.1:11435"."""

    scheme: str
    host: str
    port: int

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{self.scheme}://{host}:{self.port}"

    @classmethod
    def parse(cls, text: str) -> Upstream:
        """Read "http://127.0.0.1:11435"; the port defaults to the scheme's (80, 443)."""
        example = "like 'http://127.0.0.1:11435'"
        parts = urlsplit(text.strip())
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"expected an http:// or https:// URL {example}, got {text!r}")
        extras = [
            what
            for what, present in (
                ("a user name", parts.username is not None),
                ("a path", parts.path not in ("", "/")),
                ("a query", bool(parts.query)),
                ("a fragment", bool(parts.fragment)),
            )
            if present
        ]
        if extras:
            raise ValueError(f"an upstream is scheme://host:port only, {text!r} has {extras[0]}")
        try:
            port = parts.port
        except ValueError:
            raise ValueError(f"expected a port number in {text!r}") from None
        if port is None:
            port = 443 if parts.scheme == "https" else 80
        host = _check_host(parts.hostname, text)
        return cls(parts.scheme, host, _check_port(port, text))

    @property
    def is_loopback(self) -> bool:
        """Whether the runtime is reachable only from this host (127.0.0.0/8, ::1, localhost)."""
        if self.host == "localhost":
            return True
        try:
            return ipaddress.ip_address(self.host).is_loopback
        except ValueError:
            return False
