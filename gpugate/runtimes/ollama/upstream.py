"""The gate's own calls to an Ollama: what it holds (`/api/ps`), unloads (`keep_alive: 0`),
and how big a model will be before it is loaded (`/api/tags`, `/api/show`).

Facts about Ollama's wire behaviour follow its source (server/routes.go, server/sched.go).
"""

from __future__ import annotations

import aiohttp

from gpugate.config.model import Consumer
from gpugate.runtimes.answers import LoadedModel, ReclaimRule
from gpugate.runtimes.ollama.listing import OllamaError, parse_ps
from gpugate.runtimes.ollama.models import estimate_bytes
from gpugate.runtimes.ollama.names import canonical_name
from gpugate.runtimes.parts import Inventory, Memory, Residents


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


class OllamaMemory(Memory):
    """A model's size as Ollama sizes its load, before it was ever measured."""

    def __init__(self, consumer: Consumer) -> None:
        self.base = consumer.upstream.url
        self.headers = host_headers(consumer)

    async def estimate(
        self, session: aiohttp.ClientSession, model: str, options: str
    ) -> int | None:
        """Weights, KV cache and graph for its context, and the runner's CUDA context.

        None when Ollama does not have the model (it will answer 404 without loading).
        """
        async with session.get(self.base + "/api/tags", headers=self.headers) as resp:
            if resp.status != 200:
                raise OllamaError(f"/api/tags answered {resp.status}")
            try:
                tags = await resp.json(content_type=None)
            except ValueError as exc:
                raise OllamaError(f"/api/tags answered something that is not JSON: {exc}") from exc
        entries = tags.get("models") if isinstance(tags, dict) else None
        if not isinstance(entries, list):
            raise OllamaError(f"/api/tags answered no list of models: {str(tags)[:200]}")
        size = None
        for entry in entries:
            if not isinstance(entry, dict):
                continue
            name = entry.get("name") or entry.get("model")
            if isinstance(name, str) and normalize_model(name) == model:
                listed = entry.get("size")
                size = listed if isinstance(listed, int) and listed > 0 else 0
        if size is None:
            return None
        info = None
        async with session.post(
            self.base + "/api/show", json={"model": model}, headers=self.headers
        ) as resp:
            if resp.status == 200:
                try:
                    show = await resp.json(content_type=None)
                except ValueError:
                    show = None
                found = show.get("model_info") if isinstance(show, dict) else None
                info = found if isinstance(found, dict) else None
        return estimate_bytes(size, info, options)
