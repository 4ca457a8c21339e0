"""Client identity and request class: identity, then model, then consumer; the header may
lower a request's class and raise it only as far as its identity allows."""

from __future__ import annotations

import ipaddress

import pytest

from gpugate.config.model import Identity
from gpugate.core.classes import PriorityClass
from gpugate.identity import IdentityResolver, resolve_priority

P = PriorityClass
LAN = Identity("lan", P.INTERACTIVE, sources=(ipaddress.ip_network("192.168.1.0/24"),))
DESK = Identity("desk", P.PRODUCTION, sources=(ipaddress.ip_network("192.168.1.40/32"),))
BATCH = Identity("batch", P.BACKGROUND, tokens=("batch-secret",))
OPS = Identity("ops", P.INTERACTIVE, tokens=("ops-secret",), max_priority=P.PRODUCTION)
V6 = Identity("v6", P.BENCHMARK, sources=(ipaddress.ip_network("fd00::/8"),))
RESOLVER = IdentityResolver([LAN, DESK, BATCH, OPS, V6])


@pytest.mark.parametrize(
    ("peer", "authorization", "expected"),
    [
        ("192.168.1.7", None, LAN),
        ("192.168.1.40", None, DESK),  # the longest prefix wins
        ("::ffff:192.168.1.7", None, LAN),
        ("fd00::5", None, V6),
        ("10.0.0.1", None, None),
        ("192.168.1.7", "Bearer batch-secret", BATCH),  # a token beats the address
        ("10.0.0.1", "bearer ops-secret", OPS),
        ("10.0.0.1", "Bearer wrong", None),
        ("10.0.0.1", "Basic b3BzOnNlY3JldA==", None),
        (None, None, None),
        ("not-an-address", None, None),
    ],
)
def test_identify(peer, authorization, expected):
    assert RESOLVER.identify(peer, authorization) == expected


@pytest.mark.parametrize(
    ("identity", "default", "header", "expected"),
    [
        (None, P.INTERACTIVE, None, P.INTERACTIVE),
        (None, P.BACKGROUND, None, P.BACKGROUND),  # the model's class
        (BATCH, P.INTERACTIVE, None, P.BACKGROUND),  # the identity first
        (None, P.INTERACTIVE, "background", P.BACKGROUND),  # lowering is always allowed
        (None, P.INTERACTIVE, "production", P.INTERACTIVE),  # raising needs an identity
        (BATCH, P.INTERACTIVE, "production", P.BACKGROUND),  # beyond max_class: capped
        (OPS, P.INTERACTIVE, "production", P.PRODUCTION),  # within max_class
        (OPS, P.INTERACTIVE, "Maintenance", P.MAINTENANCE),
        (None, P.INTERACTIVE, "urgent!!", P.INTERACTIVE),  # unknown: ignored
    ],
)
def test_resolve_priority(identity, default, header, expected):
    assert resolve_priority(identity, default, header) is expected
