"""A link: one fronted consumer, its runtime, and its upstream connection pool.

A consumer is fronted when the registry knows its runtime (runtimes/registry.py); the gate
holds one link for each, and each part of the gate takes from it the runtime's part it
uses.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import aiohttp
import attrs

from gpugate.config.model import Config, Consumer
from gpugate.runtimes.base import Runtime

UPSTREAM_SKIP_AUTO_HEADERS = ("User-Agent", "Accept", "Accept-Encoding", "Content-Type")
"""Headers aiohttp would add on its own to forwarded requests: the client's (or none) go
up instead. Set on the session, which resolves them once rather than per request."""

RuntimeLookup = Callable[[Consumer], Runtime | None]
"""A consumer's runtime; None for one the gate only observes (runtimes/registry.py)."""


@attrs.define
class Link:
    """A fronted consumer with its runtime and its upstream connection pool."""

    consumer: Consumer
    runtime: Runtime
    session: aiohttp.ClientSession | None = None
    reconcile_wanted: asyncio.Event = attrs.field(factory=asyncio.Event)
    jobs_live: asyncio.Event = attrs.field(factory=asyncio.Event)
    """Set when a tracked job starts: the job loop wakes."""
    jobs_check: asyncio.Event = attrs.field(factory=asyncio.Event)
    """Set when a job may have ended out of turn (a client asked the runtime to unload):
    the job loop asks the runtime now rather than at its next poll."""
    seen_holding: bool = False
    """NVML showed the consumer holding memory while its jobs were live."""
    idle_bytes: int | None = None
    """What NVML showed for the consumer while the books held nothing for it."""

    def open(self) -> None:
        """Open the upstream connection pool (the gate's own calls to the runtime)."""
        self.session = aiohttp.ClientSession(
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=self.consumer.timeouts.connect),
            auto_decompress=False,
            skip_auto_headers=UPSTREAM_SKIP_AUTO_HEADERS,
            connector=aiohttp.TCPConnector(
                limit=0, force_close=not self.runtime.reading.keep_alive.pools_idle
            ),
        )


def make_links(config: Config, runtimes: RuntimeLookup) -> dict[str, Link]:
    """A link for every consumer the gate fronts (whose runtime it knows)."""
    links = {}
    for consumer in config.consumers:
        runtime = runtimes(consumer)
        if runtime is not None:
            links[consumer.name] = Link(consumer, runtime)
    return links


def listed(links: dict[str, Link]) -> frozenset[str]:
    """The consumers whose runtime lists what it holds (the books follow the listing)."""
    return frozenset(name for name, link in links.items() if link.runtime.inventory is not None)
