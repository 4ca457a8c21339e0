"""A runtime's health as its health route says it: the part most runtimes share."""

from __future__ import annotations

from collections.abc import Callable, Mapping

import aiohttp

from gpugate.runtimes.answers import HealthSignal
from gpugate.runtimes.parts import Health


def _ok(status: int) -> bool:
    return status == 200


class RouteHealth(Health):
    """Well when a route answers as a healthy runtime's does (200, unless `healthy` says)."""

    def __init__(
        self,
        signal: HealthSignal,
        url: str,
        *,
        healthy: Callable[[int], bool] | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        self.signal = signal
        self.url = url
        self.healthy = healthy or _ok
        self.headers = headers

    async def check(self, session: aiohttp.ClientSession) -> bool:
        async with session.get(self.url, headers=self.headers) as resp:
            await resp.read()
            return self.healthy(resp.status)
