"""How Ollama takes memory for a load, and what a first load of a model takes.

Ollama (v0.30 and later; ollama/ollama fb30760, v0.33.0-rc2) runs each loaded model in a
llama-server child it starts with (llm/llama_server.go `startLlamaServer`):

* `-c num_ctx × parallel -np parallel`: `parallel` is OLLAMA_NUM_PARALLEL (1 by default),
  1 for an embedding model (server/sched.go `load`); `num_ctx` is the request's option,
  else the Modelfile's `PARAMETER num_ctx`, else OLLAMA_CONTEXT_LENGTH, else the default
  Ollama picked at start from the VRAM it sees (server/routes.go `Serve`: the GPUs'
  total less OLLAMA_GPU_OVERHEAD each, 262144 from 47 GiB, 32768 from 23 GiB, else
  4096), capped at the model's trained context (sched.go `effectiveContext`), at least 4
  (`getRunner`);
* `-b`/`-ub`: the request's `num_batch`, else for a completion model a batch picked from
  the context (sched.go `generationBatchForContext`: 512 up to 4096, 1024 up to 32768,
  else 2048, lowered when the card is short), for an embedding model the context up to
  2048 (`DefaultEmbeddingNumBatchForContext`);
* no `-ngl`: llama-server's `--fit` places the layers; `--flash-attn auto`; the KV cache
  in OLLAMA_KV_CACHE_TYPE (f16).

So a load holds what llama-server holds for those arguments (gpugate.runtimes.llamacpp).
It is FIXED to the gate: a load that does not fit whole would run partly on the CPU
(`size_vram` < `size` in /api/ps), which the gate prevents rather than grants; and its
knob is `num_ctx`, the context whose load fits in what the gate can give (`cap`).

The model comes from the file itself: /api/show's Modelfile names the blob
(`FROM /…/models/blobs/sha256-…`, server/images.go `Model.String`), whose GGUF header the
gate reads where it can open it; where it cannot (another host, another user), from what
/api/show says of it: `model_info` (the header's keys, long arrays left empty,
routes.go `getModelData`) and `tensors` (each tensor's name, type and shape). A model
neither describes (safetensors, an /api/show without its tensors) is its file's size as
/api/tags lists it, whole on the card, and a CUDA context.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import aiohttp

from gpugate.config.model import Consumer
from gpugate.core.units import GiB
from gpugate.runtimes.answers import AdapterError
from gpugate.runtimes.footprint import Cap, Cards, Elasticity, Footprint
from gpugate.runtimes.gguf import TYPE_NAMES, MetaValue, TensorInfo, cached_header
from gpugate.runtimes.llamacpp import (
    CUDA_CONTEXT,
    LoadOptions,
    LoadSize,
    ModelShape,
    fit_context,
    header_shape,
    load_size,
    shape_of,
)
from gpugate.runtimes.ollama.names import canonical_name
from gpugate.runtimes.ollama.settings import OllamaSettings
from gpugate.runtimes.parts import Configured, Memory

MIN_NUM_CTX = 4
"""sched.go `getRunner`: a smaller num_ctx becomes 4."""
CONTEXT_TIERS = ((47 * GiB, 262144), (23 * GiB, 32768))
"""routes.go `Serve`: the default context by the VRAM Ollama sees; 4096 below."""
DEFAULT_CONTEXT = 4096
EMBEDDING_BATCH = 2048
"""llm/llama_server.go `DefaultEmbeddingNumBatch`."""
KV_TYPE_BYTES = {"f16": 2, "": 2, "f32": 4, "q8_0": 1, "q4_0": 1}
"""Bytes per K/V value of OLLAMA_KV_CACHE_TYPE (q4_0 rounded up to a byte)."""
SHAPES = 256
"""Models whose shape is remembered for `cap`."""


def default_context(cards: Cards, settings: OllamaSettings) -> int:
    """The context Ollama gives a request that sets none: OLLAMA_CONTEXT_LENGTH, else the
    VRAM tier of the cards it sees (4096 before the gate sampled them)."""
    if settings.context_length > 0:
        return settings.context_length
    vram = sum(max(0, total - settings.gpu_overhead) for total in cards.totals)
    return next((ctx for least, ctx in CONTEXT_TIERS if vram >= least), DEFAULT_CONTEXT)


def generation_batch(context: int) -> int:
    """sched.go `generationBatchForContext`."""
    if context > 32768:
        return 2048
    return 1024 if context > 4096 else 512


def option_of(options: str, name: str) -> int | None:
    """An integer runner option of a lease key's options (`num_ctx=8192,...`)."""
    for part in options.split(","):
        key, _, value = part.partition("=")
        if key == name:
            try:
                return int(value)
            except ValueError:
                return None
    return None


def modelfile_parameters(text: object) -> dict[str, int]:
    """The integer PARAMETERs /api/show's `parameters` lists ("num_ctx   8192" a line)."""
    found: dict[str, int] = {}
    if not isinstance(text, str):
        return found
    for line in text.splitlines():
        name, _, value = line.strip().partition(" ")
        try:
            found[name] = int(value.strip())
        except ValueError:
            continue
    return found


def blob_path(modelfile: object) -> str | None:
    """The model's blob, named by the Modelfile's first `FROM` that is a path."""
    if not isinstance(modelfile, str):
        return None
    for line in modelfile.splitlines():
        if line.startswith("FROM ") and line[5:].strip().startswith("/"):
            return line[5:].strip()
    return None


def show_shape(show: Mapping[str, Any]) -> ModelShape | None:
    """A model's shape from /api/show's `model_info` and `tensors`."""
    info = show.get("model_info")
    tensors = show.get("tensors")
    if not isinstance(info, Mapping) or not isinstance(tensors, list):
        return None
    metadata: dict[str, MetaValue] = {}
    for key, value in info.items():
        if isinstance(value, list):
            if value and all(isinstance(v, int | float) for v in value):
                metadata[key] = tuple(value)
        elif isinstance(value, int | float | str):
            metadata[key] = value
    table = []
    for tensor in tensors:
        if not isinstance(tensor, Mapping):
            continue
        name, kind, dims = tensor.get("name"), tensor.get("type"), tensor.get("shape")
        if isinstance(name, str) and kind in TYPE_NAMES and isinstance(dims, list):
            table.append(TensorInfo(name, TYPE_NAMES[kind], tuple(int(d) for d in dims)))
    return shape_of(metadata, table)


class OllamaMemory(Memory):
    """A model's load as Ollama starts its llama-server, sized from the model's file."""

    elasticity = Elasticity.FIXED
    knob = "num_ctx"

    def __init__(self, settings: Configured, consumer: Consumer, headers: dict[str, str]) -> None:
        super().__init__(settings)
        self.show_url = consumer.upstream.url + "/api/show"
        self.tags_url = consumer.upstream.url + "/api/tags"
        self.headers = headers
        self.ollama = consumer.settings_as(OllamaSettings)
        self.shapes: dict[str, tuple[ModelShape, dict[str, int]]] = {}
        """The last shape and Modelfile parameters read of each model."""

    async def estimate(
        self, session: aiohttp.ClientSession, model: str, options: str, cards: Cards
    ) -> Footprint | None:
        """What the model's llama-server will hold. None when Ollama does not have it (it
        answers 404 without loading)."""
        async with session.post(self.show_url, json={"model": model}, headers=self.headers) as resp:
            if resp.status == 404:
                return None
            if resp.status != 200:
                raise AdapterError(f"/api/show answered {resp.status}")
            try:
                show = await resp.json(content_type=None)
            except ValueError as exc:
                raise AdapterError(f"/api/show answered something not JSON: {exc}") from None
        if not isinstance(show, Mapping):
            raise AdapterError("/api/show answered something that is not an object")
        path = blob_path(show.get("modelfile"))
        header = cached_header(path) if path is not None else None
        shape = header_shape(header) if header is not None else show_shape(show)
        if shape is None:
            # Not a GGUF model the gate can read (safetensors, or /api/show without its
            # tensors): its file's size, on the card whole, and a CUDA context.
            size = await self._listed_size(session, model)
            return None if size is None else Footprint.fixed(size + CUDA_CONTEXT)
        parameters = modelfile_parameters(show.get("parameters"))
        if len(self.shapes) >= SHAPES:
            self.shapes.pop(next(iter(self.shapes)))
        self.shapes[model] = (shape, parameters)
        return Footprint.fixed(self.load(shape, parameters, options, cards).total)

    async def _listed_size(self, session: aiohttp.ClientSession, model: str) -> int | None:
        """The model's size as /api/tags lists it; None when it lists no such model."""
        async with session.get(self.tags_url, headers=self.headers) as resp:
            if resp.status != 200:
                raise AdapterError(f"/api/tags answered {resp.status}")
            try:
                tags = await resp.json(content_type=None)
            except ValueError as exc:
                raise AdapterError(f"/api/tags answered something not JSON: {exc}") from None
        entries = tags.get("models") if isinstance(tags, Mapping) else None
        if not isinstance(entries, list):
            raise AdapterError(f"/api/tags answered no list of models: {str(tags)[:200]}")
        for entry in entries:
            if not isinstance(entry, Mapping):
                continue
            name = entry.get("name") or entry.get("model")
            if isinstance(name, str) and canonical_name(name) == model:
                listed = entry.get("size")
                return listed if isinstance(listed, int) and listed > 0 else 0
        return None

    def load(
        self, shape: ModelShape, parameters: Mapping[str, int], options: str, cards: Cards
    ) -> LoadSize:
        """What the llama-server Ollama starts for `shape` holds, given the request's runner
        `options` and the Modelfile's `parameters`."""
        return load_size(shape, self.launch(shape, parameters, options, cards))

    def launch(
        self, shape: ModelShape, parameters: Mapping[str, int], options: str, cards: Cards
    ) -> LoadOptions:
        """The arguments Ollama starts the model's llama-server with."""
        settings = self.ollama

        def chosen(name: str) -> int | None:
            value = option_of(options, name)
            return parameters.get(name) if value is None else value

        num_ctx = chosen("num_ctx")
        if num_ctx is None:
            num_ctx = default_context(cards, settings)
        num_ctx = max(MIN_NUM_CTX, num_ctx)
        if shape.n_ctx_train:
            num_ctx = min(num_ctx, shape.n_ctx_train)
        parallel = 1 if shape.embedding else max(1, settings.num_parallel)
        context = num_ctx * parallel
        batch = chosen("num_batch")
        if batch is None or batch <= 0:
            batch = min(EMBEDDING_BATCH, context) if shape.embedding else generation_batch(context)
        num_gpu = chosen("num_gpu")
        return LoadOptions(
            n_ctx=context,
            n_parallel=parallel,
            unified=False,
            n_ubatch=min(batch, context),
            n_gpu_layers=num_gpu if num_gpu is not None and num_gpu >= 0 else None,
            kv_bytes=KV_TYPE_BYTES.get(settings.kv_cache_type, 2),
            on_gpu=num_gpu != 0,
        )

    def cap(self, model: str, nbytes: int, cards: Cards) -> Cap | None:
        """The largest `num_ctx` whose load fits in `nbytes` (a request may carry it);
        None before the model's shape was read."""
        known = self.shapes.get(model)
        if known is None:
            return None
        shape, parameters = known
        launch = self.launch(shape, parameters, "", cards)
        context = fit_context(shape, launch, nbytes) // launch.n_parallel
        return Cap(options=(("num_ctx", context),))
