"""The models the simulated Ollama has on disk: names, digests, sizes, capabilities, and for
a model with a shape its manifest and GGUF blob (blobs.py)."""

from __future__ import annotations

import enum
import hashlib
from collections.abc import Iterator
from pathlib import Path

import attrs

from gpugate_sim.ollama.blobs import shaped, write_blob, write_manifest
from gpugate_sim.ollama.names import ModelName, ModelRef
from gpugate_sim.scenario import OllamaModelSpec

__all__ = ["Capability", "Catalog", "CatalogModel", "ModelName"]


class Capability(enum.Enum):
    COMPLETION = "completion"
    EMBEDDING = "embedding"


def _sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


@attrs.frozen
class CatalogModel:
    """One model of the catalog with everything derived from its spec."""

    spec: OllamaModelSpec
    name: ModelName
    digest: str
    """The manifest digest (64 hex), as /api/tags and /api/ps show it."""
    blob_digest: str
    blob_path: str
    modified_at: float
    blob_size: int = 0
    """The blob's size on disk; 0: no blob was written (the model has no shape)."""
    default_num_ctx: int = 4096
    """The context of a request that sets none: Ollama's by the VRAM it sees for a model
    with a shape (sizing.vram_context), else the spec's."""
    auto_num_ctx: bool = False
    """Whether that default is Ollama's automatic one (server/routes.go
    `usesAutomaticNumCtx`: a model with a shape, and no OLLAMA_CONTEXT_LENGTH); a spec's
    `default_num_ctx` plays a Modelfile's num_ctx."""

    @property
    def display(self) -> str:
        return self.name.short

    @property
    def capabilities(self) -> tuple[Capability, ...]:
        return (Capability.EMBEDDING,) if self.spec.embedding else (Capability.COMPLETION,)

    @property
    def file_size(self) -> int:
        """Bytes on disk: the spec's, else its blob's, else the runner size without the
        default KV cache."""
        if self.spec.file_size:
            return self.spec.file_size
        if self.blob_size:
            return self.blob_size
        kv = self.default_num_ctx * self.spec.kv_bytes_per_token
        return max(1, self.spec.size - kv)

    @property
    def num_parallel_cap(self) -> int | None:
        """Embedding models always run with one slot."""
        return 1 if self.spec.embedding else None

    def details(self) -> dict[str, object]:
        """api.ModelDetails."""
        return {
            "parent_model": "",
            "format": "gguf",
            "family": self.spec.family,
            "families": [self.spec.family],
            "parameter_size": self.spec.parameter_size,
            "quantization_level": self.spec.quantization_level,
        }


class Catalog:
    """Name lookup over the scenario's models."""

    def __init__(
        self,
        specs: tuple[OllamaModelSpec, ...],
        blobs_dir: Path,
        now: float,
        *,
        default_ctx: int = 4096,
        auto_ctx: bool = True,
    ) -> None:
        """`default_ctx`: the context Ollama gives a request that sets none (by its VRAM);
        `auto_ctx`: it is automatic (no OLLAMA_CONTEXT_LENGTH)."""
        self._models: dict[str, CatalogModel] = {}
        for index, spec in enumerate(specs):
            name = ModelName.parse(spec.name)
            if name is None:
                raise ValueError(f"ollama.models[{index}].name: invalid model name {spec.name!r}")
            if name.key in self._models:
                raise ValueError(f"ollama.models[{index}].name: {spec.name!r} is listed twice")
            digest = spec.digest.removeprefix("sha256:") or _sha256(f"manifest:{name.key}")
            blob = _sha256(f"blob:{name.key}")
            path = blobs_dir / f"sha256-{blob}"
            size = 0
            if shaped(spec):
                size = write_blob(path, spec)
                parts = (name.host, name.namespace, name.model, name.tag)
                write_manifest(blobs_dir.parent, parts, blob, size)
            self._models[name.key] = CatalogModel(
                spec=spec,
                name=name,
                digest=digest,
                blob_digest=blob,
                blob_path=str(path),
                # One second apart, so /api/tags (newest first) lists them in spec order.
                modified_at=float(int(now) - index),
                blob_size=size,
                default_num_ctx=(
                    min(default_ctx, spec.context_length) if size else spec.default_num_ctx
                ),
                auto_num_ctx=bool(size) and auto_ctx,
            )

    def find(self, text: str) -> CatalogModel | None:
        """The model a request names, or None (unknown, empty or malformed)."""
        name = ModelName.parse(text)
        return None if name is None else self._models.get(name.key)

    def lookup(self, raw: str, *, fold: bool = True) -> CatalogModel | None:
        """The local model a request's `model` names (parseAndValidateModelRef: Go's
        TrimSpace and a :local suffix dropped); None also for a :cloud one, which Ollama
        sends to the cloud and never loads here. `fold` False: the name must be written as
        the model was installed (EmbeddingsHandler opens the manifest by the name as given,
        on a file system that tells case apart; the other handlers fold it first)."""
        ref = ModelRef.parse(raw)
        if ref is None or ref.source == "cloud":
            return None
        model = self.find(ref.base)
        if model is None or fold:
            return model
        name = ModelName.parse(ref.base)
        written = None if name is None else attrs.astuple(name)
        return model if written == attrs.astuple(model.name) else None

    def __iter__(self) -> Iterator[CatalogModel]:
        return iter(self._models.values())

    def __len__(self) -> int:
        return len(self._models)
