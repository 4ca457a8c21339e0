"""vLLM's sleep mode as the lifecycle of a process runtime: an eviction puts it to sleep
(`sleep`), a request that needs it wakes it (`wake`), `probe` asks whether it is awake.

vLLM (`--enable-sleep-mode`, routes only with `VLLM_SERVER_DEV_MODE=1`; vllm/entrypoints/
serve/sleep/api_router.py, vllm/device_allocator/cumem.py):

* `POST /sleep?level=1` copies the weights to CPU memory and discards the KV cache;
  `level=2` discards both. It answers 200 once the engine sleeps. The CUDA context and
  PyTorch's own cache stay on the card: a residual the gate keeps counting for the consumer.
* `POST /wake_up` maps the memory back (level 1: the weights copied back). After level 2
  the weights must be loaded again: `wake_up?tags=weights`, `POST /collective_rpc
  {"method": "reload_weights"}`, then `wake_up?tags=kv_cache` (docs/features/sleep_mode.md).
* `GET /is_sleeping` → `{"is_sleeping": bool}`. A request that arrives while it sleeps is
  queued, not answered, until it is awake: the gate wakes it first.

The server itself is not the gate's to start or stop; its port stays open while it sleeps.
"""

from __future__ import annotations

import json
from typing import ClassVar

import aiohttp

from gpugate.core.lifecycle import LifeReport
from gpugate.runtimes.footprint import Cap
from gpugate.runtimes.process import Exit, ProcessControl, ProcessControlError

NOT_OURS = "vLLM's server is not the gate's to start or stop: it is put to sleep and woken"
NO_SLEEP_ROUTES = (
    "vLLM serves no sleep routes: start it with --enable-sleep-mode and "
    "VLLM_SERVER_DEV_MODE=1 in its environment"
)


class SleepMode(ProcessControl):
    """A vLLM server put to sleep and woken over HTTP."""

    owns_port: ClassVar[bool] = False

    def __init__(self, url: str, *, level: int = 1, timeout: float = 120.0) -> None:
        self.url = url
        self.level = level
        self.timeout = aiohttp.ClientTimeout(total=timeout)
        self._slept_at_level = level
        """The level of its last sleep: how it must be woken."""

    async def _post(self, path: str, json: object | None = None) -> None:
        try:
            async with (
                aiohttp.ClientSession(timeout=self.timeout) as session,
                session.post(self.url + path, json=json) as resp,
            ):
                text = await resp.text()
                if resp.status != 200:
                    hint = f" ({NO_SLEEP_ROUTES})" if resp.status == 404 else ""
                    raise ProcessControlError(
                        f"POST {path} answered {resp.status}: {text[:200]}{hint}",
                        stderr=text[:2000],
                    )
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise ProcessControlError(f"POST {path} failed: {exc}") from exc

    sleeps: ClassVar[bool] = True

    async def start(self, devices: str | None = None, cap: Cap | None = None) -> None:
        raise ProcessControlError(NOT_OURS)

    async def stop(self) -> Exit | None:
        raise ProcessControlError(NOT_OURS)

    async def wake(self) -> None:
        """Wake it; after a level-2 sleep its weights are loaded again first."""
        if self._slept_at_level >= 2:
            await self._post("/wake_up?tags=weights")
            await self._post("/collective_rpc", {"method": "reload_weights"})
            await self._post("/wake_up?tags=kv_cache")
        else:
            await self._post("/wake_up")

    async def sleep(self) -> None:
        """Put it to sleep at the configured level; the process stays."""
        await self._post(f"/sleep?level={self.level}")
        self._slept_at_level = self.level

    async def probe(self) -> LifeReport:
        return LifeReport.FOUND_UP if await self.is_running() else LifeReport.FOUND_ASLEEP

    async def is_running(self) -> bool:
        """Whether it is awake (its weights and KV cache on the card)."""
        try:
            async with (
                aiohttp.ClientSession(timeout=self.timeout) as session,
                session.get(self.url + "/is_sleeping") as resp,
            ):
                status, text = resp.status, await resp.text()
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise ProcessControlError(f"GET /is_sleeping failed: {exc}") from exc
        if status == 404:
            raise ProcessControlError(f"GET /is_sleeping answered 404: {NO_SLEEP_ROUTES}")
        try:
            data = json.loads(text)
        except ValueError:
            data = None
        sleeping = data.get("is_sleeping") if isinstance(data, dict) else None
        if status != 200 or not isinstance(sleeping, bool):
            raise ProcessControlError(f"GET /is_sleeping answered {status}: {text[:200]}")
        return not sleeping
