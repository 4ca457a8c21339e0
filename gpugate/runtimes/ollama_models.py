"""What Ollama says of its installed models (`POST /api/show`), kept for a while.

A request's model decides some of Ollama's refusals (ollama_needs.py); the gate asks
Ollama once per model and keeps the answer for `FACTS_TTL`, so a request pays for a
`/api/show` only the first time its model is seen in that window. A model Ollama does not
have gets no facts: the sizing step answers for it (no lease, Ollama's own 404).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import aiohttp

from gpugate.core.units import MiB
from gpugate.runtimes.base import AdapterError
from gpugate.runtimes.ollama_needs import ModelFacts

FACTS_TTL = 60.0
"""Seconds a model's capabilities are trusted (they change only when it is pulled again)."""
FRESH = 1.0
"""How old an answer may be for a refusal to rest on it: a model pulled a moment ago is
seen, and a client asking for names that are not there makes one listing a second."""
FACTS_LIMIT = 4096
"""Models remembered at once; past it the oldest answer is dropped."""


class ModelFactsCache:
    """One Ollama's answers to `/api/show`, by model."""

    def __init__(self, url: str, headers: dict[str, str], bound: float) -> None:
        self.url = url
        self.headers = headers
        self.timeout = aiohttp.ClientTimeout(total=bound)
        """Each call to Ollama is bounded (the consumer's `timeouts.control`)."""
        self._facts: dict[str, tuple[ModelFacts | None, float]] = {}
        self._installed: tuple[frozenset[str], float] | None = None

    async def facts(
        self, session: aiohttp.ClientSession, model: str, now: float, *, max_age: float = FACTS_TTL
    ) -> ModelFacts | None:
        """The model's capabilities and whether it is a remote stub; None: not installed.
        `max_age`: how old an answer may be (a refusal is trusted only on a fresh one)."""
        known = self._facts.get(model)
        if known is not None and now - known[1] <= max_age:
            return known[0]
        facts = await self._show(session, model)
        if len(self._facts) >= FACTS_LIMIT:
            self._facts.pop(next(iter(self._facts)))
        self._facts[model] = (facts, now)
        return facts

    async def installed(
        self, session: aiohttp.ClientSession, now: float, *, max_age: float = FACTS_TTL
    ) -> frozenset[str]:
        """The names of the installed models as Ollama lists them (`/api/tags`), at most
        `max_age` seconds old."""
        if self._installed is not None and now - self._installed[1] <= max_age:
            return self._installed[0]
        tags = await self._json(
            session.get(self.url + "/api/tags", headers=self.headers, timeout=self.timeout)
        )
        entries = tags.get("models") if isinstance(tags, dict) else None
        names = frozenset(
            str(entry.get("name") or entry.get("model"))
            for entry in (entries if isinstance(entries, list) else [])
            if isinstance(entry, dict)
        )
        self._installed = (names, now)
        return names

    async def _show(self, session: aiohttp.ClientSession, model: str) -> ModelFacts | None:
        request = session.post(
            self.url + "/api/show",
            json={"model": model},
            headers=self.headers,
            timeout=self.timeout,
        )
        show = await self._json(request, missing=True)
        if show is None:
            return None
        if not isinstance(show, dict):
            raise AdapterError("/api/show answered something that is not an object")
        capabilities = show.get("capabilities")
        if not isinstance(capabilities, list):
            capabilities = []
        remote = show.get("remote_host")
        details = show.get("details")
        families = details.get("families") if isinstance(details, dict) else None
        return ModelFacts(
            frozenset(c for c in capabilities if isinstance(c, str)),
            remote=isinstance(remote, str) and bool(remote),
            retired=isinstance(families, list)
            and "mllama" in families
            and bool(show.get("projector_info")),
        )

    @staticmethod
    async def _json(request: Any, *, missing: bool = False) -> Any:
        """The JSON answer of a call to Ollama; None for a 404 when `missing` is allowed."""
        async with request as resp:
            if missing and resp.status == 404:
                return None
            if resp.status != 200:
                raise AdapterError(f"{resp.url.path} answered {resp.status}")
            try:
                return await resp.json(content_type=None)
            except ValueError as exc:
                raise AdapterError(f"{resp.url.path} answered something not JSON: {exc}") from None


# -- sizes before a first measurement --------------------------------------------------

RUNTIME_OVERHEAD = 256 * MiB
"""CUDA context and compute buffers on top of weights and KV cache, for estimates."""
DEFAULT_NUM_CTX = 4096


def kv_cache_bytes(model_info: Mapping[str, Any], num_ctx: int) -> int:
    """f16 K and V for every layer: 2 × layers × ctx × kv_heads × head_dim × 2 bytes."""
    arch = model_info.get("general.architecture")
    if not isinstance(arch, str):
        return 0
    layers = model_info.get(f"{arch}.block_count")
    heads = model_info.get(f"{arch}.attention.head_count")
    kv_heads = model_info.get(f"{arch}.attention.head_count_kv", heads)
    width = model_info.get(f"{arch}.embedding_length")
    key_length = model_info.get(f"{arch}.attention.key_length")
    if not all(isinstance(v, int) and v > 0 for v in (layers, heads, kv_heads, width)):
        return 0
    head_dim = key_length if isinstance(key_length, int) and key_length > 0 else width // heads
    trained = model_info.get(f"{arch}.context_length")
    if isinstance(trained, int) and trained > 0:
        num_ctx = min(num_ctx, trained)
    return 2 * layers * num_ctx * kv_heads * head_dim * 2


def num_ctx_of(options: str) -> int:
    for part in options.split(","):
        name, _, value = part.partition("=")
        if name == "num_ctx":
            try:
                return max(4, int(json.loads(value)))
            except (ValueError, TypeError):
                return DEFAULT_NUM_CTX
    return DEFAULT_NUM_CTX
