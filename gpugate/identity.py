"""Client identity and request priority.

A request's class comes from the first of: the identity it presents (bearer token,
then source address), the model's configured class, the consumer's default. The
`X-GPUGate-Priority` header may lower it, and raise it only as far as the identity's
`max_class` allows.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence

from gpugate.config.model import Identity
from gpugate.core.classes import PriorityClass

PRIORITY_HEADER = "X-GPUGate-Priority"


class IdentityResolver:
    """Maps (source address, Authorization header) to a configured identity."""

    def __init__(self, identities: Sequence[Identity]) -> None:
        self.replace(identities)

    def replace(self, identities: Sequence[Identity]) -> None:
        """Use `identities` from now on (a configuration reload)."""
        self._identities = tuple(identities)
        self._by_token = {token: ident for ident in identities for token in ident.tokens}
        self._by_peer: dict[str, Identity | None] = {}

    def identify(self, peer: str | None, authorization: str | None) -> Identity | None:
        """Token first (it is the stronger claim), then the longest matching CIDR."""
        if authorization:
            scheme, _, token = authorization.partition(" ")
            if scheme.lower() == "bearer" and token.strip() in self._by_token:
                return self._by_token[token.strip()]
        if not peer or not self._identities:
            return None
        try:
            return self._by_peer[peer]
        except KeyError:
            found = self._by_address(peer)
            if len(self._by_peer) < 65536:
                self._by_peer[peer] = found
            return found

    def _by_address(self, peer: str) -> Identity | None:
        try:
            address = ipaddress.ip_address(peer.split("%", 1)[0])
        except ValueError:
            return None
        if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped:
            address = address.ipv4_mapped
        best: tuple[int, Identity] | None = None
        for ident in self._identities:
            for network in ident.sources:
                matches = address.version == network.version and address in network
                if matches and (best is None or network.prefixlen > best[0]):
                    best = (network.prefixlen, ident)
        return best[1] if best else None


def resolve_priority(
    identity: Identity | None,
    default: PriorityClass,
    requested: str | None,
) -> PriorityClass:
    """The request's class. `default` is the model's class, else the consumer's.

    An unknown header value is ignored rather than refused: the request still runs
    at the class it would have had without the header.
    """
    base = identity.priority if identity is not None else default
    if not requested:
        return base
    try:
        asked = PriorityClass.parse(requested)
    except ValueError:
        return base
    if asked <= base:
        return asked
    if identity is None:
        return base
    ceiling = identity.max_priority or identity.priority
    return min(asked, max(ceiling, base))
