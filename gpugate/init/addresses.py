"""Addresses: where the gate listens in a runtime's place, and the loopback port it moves to."""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence

from gpugate.init.recognise import Address, Found


def show_address(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def gate_host(host: str) -> tuple[str, str]:
    """(the address the gate listens on in the runtime's place, a note or "")."""
    if host in ("", "*", "localhost"):
        return ("0.0.0.0", "") if host != "localhost" else ("127.0.0.1", "")
    try:
        ip = ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return (
            "0.0.0.0",
            f"it was told to listen on {host!r}, a name: the gate listens on every address",
        )
    if ip.is_unspecified:
        if ip.version == 4:
            return "0.0.0.0", ""
        return "0.0.0.0", (
            "it listened on [::] (IPv6, and IPv4 through it): the gate listens on 0.0.0.0, "
            "IPv4 only"
        )
    return (f"[{ip}]" if ip.version == 6 else str(ip)), ""


def with_address(argv: Sequence[str], found: Found, port: int) -> tuple[str, ...]:
    """`argv` with the runtime's host and port options set to 127.0.0.1 and `port`."""
    rule = found.rule
    words = list(argv)
    for names, value in ((rule.host_options, "127.0.0.1"), (rule.port_options, str(port))):
        if not names:
            continue
        replaced = False
        i = 0
        while i < len(words):
            word = words[i]
            if word in names:
                following = words[i + 1] if i + 1 < len(words) else None
                if following is not None and not following.startswith("-"):
                    words[i + 1] = value
                else:
                    words.insert(i + 1, value)
                replaced = True
                i += 2
                continue
            if any(word.startswith(name + "=") for name in names if name.startswith("--")):
                words[i] = f"{word.split('=', 1)[0]}={value}"
                replaced = True
            i += 1
        if not replaced:
            words += [names[0], value]
    return tuple(words)


class Ports:
    """Ports taken: what listens now, what the gate takes, what was handed out."""

    def __init__(self, in_use: frozenset[int], reserved: set[int]) -> None:
        self.taken = set(in_use) | reserved

    def next_free(self, after: int) -> int:
        port = after + 1
        while port in self.taken or port > 65535:
            port = port + 1 if port < 65535 else 1024
        self.taken.add(port)
        return port


def other_addresses(found: Found, address: Address, taken: str) -> list[str]:
    """A note when the runtime listens on more addresses than the one the gate takes, and
    a client of one of them would be cut off."""
    others = sorted(
        {
            show_address(li.host, li.port)
            for li in found.listeners
            if li.port == address.port
            and li.host != address.host
            and not (taken == "0.0.0.0" and ":" not in li.host)
        }
    )
    if not others:
        return []
    return [
        f"it also listens on {', '.join(others)}: the gate takes {taken}:{address.port} "
        "only, and a client that connects there now gets no answer once it moves"
    ]
