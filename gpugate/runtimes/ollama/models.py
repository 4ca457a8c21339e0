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
import attrs

from gpugate.core.units import MiB
from gpugate.runtimes.base import AdapterError
from gpugate.runtimes.ollama.needs import ModelFacts

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
        info = show.get("model_info")
        arch = info.get("general.architecture") if isinstance(info, dict) else None
        return ModelFacts(
            frozenset(c for c in capabilities if isinstance(c, str)),
            remote=isinstance(remote, str) and bool(remote),
            retired=isinstance(families, list)
            and "mllama" in families
            and bool(show.get("projector_info")),
            layers=info_count(info.get(f"{arch}.block_count"))
            if isinstance(info, dict) and isinstance(arch, str)
            else 0,
        )

    def known(self, model: str) -> ModelFacts | None:
        """The last answer for `model`, however old (None: never asked, or not installed)."""
        known = self._facts.get(model)
        return None if known is None else known[0]

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
# As Ollama v0.24.0 sizes a load (llm/server.go `Load`, fs/ggml `GraphSize`): the weights,
# the KV cache for the context the runner gets, the compute graph, and the CUDA context
# NVML counts on top of what Ollama itself reports.

RUNTIME_OVERHEAD = 512 * MiB
"""The runner's CUDA context and library workspaces: held on the card, never part of
Ollama's own figures (llama3.2:3b on a 16 GiB card: 3.1 GiB in NVML for 2.57 GiB of
weights, KV cache and graph)."""
DEFAULT_NUM_CTX = 4096
"""The context a runner gets when the request sets none: OLLAMA_CONTEXT_LENGTH unset, a
card under 23 GiB (server/routes.go `Serve`: 4k below, 32k from 23 GiB, 256k from 47)."""
DEFAULT_NUM_BATCH = 512
NUM_PARALLEL = 1
"""OLLAMA_NUM_PARALLEL's default: the KV cache holds one context."""
F16 = 2
"""Bytes per KV cache element (OLLAMA_KV_CACHE_TYPE's default, f16)."""
LLAMA_GRAPHS = frozenset({"llama", "llama4"})
GEMMA_GRAPHS = frozenset({"gemma", "gemma2", "gemma3", "gemma3n"})
GEMMA3_GLOBAL_EVERY = 6


@attrs.frozen
class Geometry:
    """What /api/show's `model_info` says of a model's shape (the GGUF's keys)."""

    arch: str
    layers: int
    embedding: int
    heads: int
    kv_heads: int
    key_length: int
    value_length: int
    trained_ctx: int
    vocab: int
    sliding_window: int
    embedding_model: bool

    @classmethod
    def read(cls, info: Mapping[str, Any]) -> Geometry | None:
        """None when the keys a size needs are missing (weights alone are known then)."""
        arch = info.get("general.architecture")
        if not isinstance(arch, str):
            return None
        layers = info_count(info.get(f"{arch}.block_count"))
        heads = info_count(info.get(f"{arch}.attention.head_count"))
        kv_heads = info_count(info.get(f"{arch}.attention.head_count_kv")) or heads
        width = info_count(info.get(f"{arch}.embedding_length"))
        if not (layers and heads and kv_heads and width):
            return None
        key_length = info_count(info.get(f"{arch}.attention.key_length")) or width // heads
        value_length = info_count(info.get(f"{arch}.attention.value_length")) or key_length
        tokens = info.get("tokenizer.ggml.tokens")
        vocab = info_count(info.get(f"{arch}.vocab_size")) or (
            len(tokens) if isinstance(tokens, list) else 0
        )
        return cls(
            arch=arch,
            layers=layers,
            embedding=width,
            heads=heads,
            kv_heads=kv_heads,
            key_length=key_length,
            value_length=value_length,
            trained_ctx=info_count(info.get(f"{arch}.context_length")),
            vocab=vocab,
            sliding_window=info_count(info.get(f"{arch}.attention.sliding_window")),
            embedding_model=f"{arch}.pooling_type" in info,
        )

    def context(self, num_ctx: int) -> int:
        """num_ctx capped at the training context, as the runner is started."""
        return min(num_ctx, self.trained_ctx) if self.trained_ctx else num_ctx

    def kv_bytes(self, num_ctx: int, batch: int) -> int:
        """The KV cache: every attention layer holds K and V for the whole context
        (gemma3's sliding layers only their window)."""
        context = self.context(num_ctx) * NUM_PARALLEL
        per_token = (self.key_length + self.value_length) * self.kv_heads * F16
        total = 0
        for layer in range(self.layers):
            tokens = context
            if (
                self.arch == "gemma3"
                and self.sliding_window
                and (layer + 1) % GEMMA3_GLOBAL_EVERY != 0
            ):
                tokens = NUM_PARALLEL * self.sliding_window + batch
            total += tokens * per_token
        return total

    def graph_bytes(self, num_ctx: int, batch: int, kv: int) -> int:
        """The compute graph of a model wholly on the GPU (GraphSize's full offload)."""
        context = self.context(num_ctx) * NUM_PARALLEL
        width, heads, vocab = self.embedding, self.heads, self.vocab
        vocab_graph = 4 * batch * (width + vocab)
        if self.arch in LLAMA_GRAPHS:
            return max(4 * batch * (1 + 4 * width + context * (1 + heads)), vocab_graph)
        if self.arch == "qwen2":
            return max(vocab_graph, 4 * batch * (1 + 2 * width + context + context * heads))
        if self.arch in GEMMA_GRAPHS:
            graph = max(
                vocab_graph,
                4
                * batch
                * (2 + context + context * heads + 2 * width + 2 * self.key_length * heads),
            )
            return 4 * graph if self.arch == "gemma3n" else graph
        # Every other architecture: Ollama's fallback from the KV cache's size.
        return heads // self.kv_heads * kv // 6


def info_count(value: object) -> int:
    """A positive count from model_info (a per-layer list counts as its largest)."""
    if isinstance(value, list):
        value = max((v for v in value if type(v) is int), default=0)
    return value if type(value) is int and value > 0 else 0


def estimate_bytes(weights: int, info: Mapping[str, Any] | None, options: str) -> int:
    """What a first load of a model takes on the card, as Ollama sizes it: its weights
    (the file), the KV cache and graph for the context it will get, and a CUDA context."""
    geometry = Geometry.read(info) if info is not None else None
    if geometry is None:
        return weights + RUNTIME_OVERHEAD
    num_ctx = max(4, option_of(options, "num_ctx", DEFAULT_NUM_CTX))
    batch = min(option_of(options, "num_batch", DEFAULT_NUM_BATCH), geometry.context(num_ctx))
    if geometry.embedding_model:
        batch = max(batch, geometry.context(num_ctx))
    kv = geometry.kv_bytes(num_ctx, batch)
    return weights + kv + geometry.graph_bytes(num_ctx, batch, kv) + RUNTIME_OVERHEAD


def kv_cache_bytes(model_info: Mapping[str, Any], num_ctx: int) -> int:
    """The KV cache for `num_ctx` tokens (0 when model_info lacks the model's shape)."""
    geometry = Geometry.read(model_info)
    if geometry is None:
        return 0
    return geometry.kv_bytes(num_ctx, min(DEFAULT_NUM_BATCH, geometry.context(num_ctx)))


def option_of(options: str, name: str, default: int) -> int:
    """An integer runner option of a lease key's options (`num_ctx=8192,...`)."""
    for part in options.split(","):
        key, _, value = part.partition("=")
        if key == name:
            try:
                return int(json.loads(value))
            except (ValueError, TypeError):
                return default
    return default


def num_ctx_of(options: str) -> int:
    return max(4, option_of(options, "num_ctx", DEFAULT_NUM_CTX))
