"""The gate's own calls to an Ollama: what it holds (`/api/ps`) and unloads
(`keep_alive: 0`). What a model will take before it is loaded is memory.py's.

Facts about Ollama's wire behaviour follow its source (server/routes.go, server/sched.go).
"""

from __future__ import annotations

import math

import aiohttp

from gpugate.config.model import Consumer
from gpugate.runtimes.answers import LoadedModel, ReclaimRule
from gpugate.runtimes.ollama.listing import OllamaError, parse_ps
from gpugate.runtimes.ollama.names import canonical_name
from gpugate.runtimes.parts import Inventory, Residents


def normalize_model(name: str) -> str:
    """The gate's key for a model (see ollama_names); an invalid name is kept as written."""
    return canonical_name(name) or name


def host_headers(consumer: Consumer) -> dict[str, str]:
    """Ollama checks Host when it listens on loopback; its own name always passes."""
    return {"Host": f"127.0.0.1:{consumer.upstream.port}"}


class OllamaInventory(Inventory):
    """What Ollama has in memory (/api/ps; a model still loading is not listed)."""

    def __init__(self, consumer: Consumer) -> None:
        self.url = consumer.upstream.url + "/api/ps"
        self.headers = host_headers(consumer)

    async def listing(self, session: aiohttp.ClientSession) -> list[LoadedModel]:
        """Raises OllamaError for anything but a 200 with `{"models": [...]}` whose entries
        have a name and integer sizes: a listing the gate cannot read is no listing."""
        async with session.get(self.url, headers=self.headers) as resp:
            if resp.status != 200:
                raise OllamaError(f"/api/ps answered {resp.status}")
            try:
                data = await resp.json(content_type=None)
            except ValueError as exc:
                raise OllamaError(f"/api/ps answered something that is not JSON: {exc}") from exc
        return parse_ps(data)


class OllamaResidents(Residents):
    """Ollama unloads a model when asked with `keep_alive: 0`."""

    # server/sched.go waits for free memory to recover by 75 % of the runner's estimate.
    reclaim_rule = ReclaimRule(recovered_fraction=0.75)

    def __init__(self, consumer: Consumer) -> None:
        self.consumer = consumer
        self.url = consumer.upstream.url + "/api/generate"
        self.embed_url = consumer.upstream.url + "/api/embed"
        self.headers = host_headers(consumer)

    async def evict(self, session: aiohttp.ClientSession, model: str) -> None:
        """Ask Ollama to unload a model (keep_alive 0, empty prompt); it answers at once."""
        payload = {"model": model, "keep_alive": 0}
        async with session.post(self.url, json=payload, headers=self.headers) as resp:
            text = await resp.text()
            if resp.status != 200:
                raise OllamaError(f"unload of {model} answered {resp.status}: {text[:200]}")

    def evict_timeout(self) -> float:
        return self.consumer.timeouts.control

    warms = True

    async def warm(self, session: aiohttp.ClientSession, model: str, ttl: float | None) -> None:
        """Load a model with nothing to run. `/api/generate` with no prompt and a keep_alive
        other than 0 loads it and answers `done_reason: "load"` once it is loaded (Ollama
        v0.24.0 server/routes.go GenerateHandler, after scheduleRunner; runtime-contracts.md
        §1.1, docs/runtimes/ollama.md "The scheduler"). scheduleRunner refuses a model
        without the completion capability (an embedding model) with 400 `does not support
        generate` before loading anything, so such a model is loaded by `/api/embed` with
        no input, which schedules its runner the same way and answers `embeddings: []`
        (EmbedHandler). keep_alive is the model's ttl left, -1 (forever) for none."""
        keep_alive: int = -1 if ttl is None else max(1, math.ceil(ttl))
        payload = {"model": model, "keep_alive": keep_alive}
        async with session.post(self.url, json=payload, headers=self.headers) as resp:
            text = await resp.text()
            if resp.status == 200:
                return
            if not (resp.status == 400 and "does not support generate" in text):
                raise OllamaError(f"load of {model} answered {resp.status}: {text[:200]}")
        async with session.post(self.embed_url, json=payload, headers=self.headers) as resp:
            text = await resp.text()
            if resp.status != 200:
                raise OllamaError(f"load of {model} answered {resp.status}: {text[:200]}")

    def warm_timeout(self) -> float:
        # A load is answered once the model is in memory: as long as a first byte may take.
        return self.consumer.timeouts.first_byte
