"""The models the simulated Ollama has "on disk": names, digests, sizes, capabilities."""

from __future__ import annotations

import enum
import hashlib
import re
from collections.abc import Iterator
from pathlib import Path

import attrs

from gpugate.sim.scenario import OllamaModelSpec

DEFAULT_HOST = "registry.ollama.ai"
DEFAULT_NAMESPACE = "library"
DEFAULT_TAG = "latest"


class Capability(enum.Enum):
    COMPLETION = "completion"
    EMBEDDING = "embedding"


_KINDS = frozenset({"skill", "agent", "mcp"})
_MISSING = "!MISSING!"
_PARTS = {
    "host": (350, re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.:-]*")),
    "namespace": (80, re.compile(r"[A-Za-z0-9_][A-Za-z0-9_-]*")),
    "model": (80, re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*")),
    "tag": (80, re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*")),
}


def _cut_last(text: str, sep: str) -> tuple[str, str, bool]:
    """cutPromised: an empty side of a separator that is there is a missing part."""
    before, found, after = text.rpartition(sep)
    if not found:
        return text, "", False
    return before or _MISSING, after or _MISSING, True


def _scheme_less(text: str) -> str:
    scheme, found, host = text.partition("://")
    return host if found else scheme


def _valid_part(kind: str, text: str) -> bool:
    longest, pattern = _PARTS[kind]
    return text.isascii() and len(text) <= longest and pattern.fullmatch(text) is not None


@attrs.frozen
class ModelName:
    """A model reference as Ollama parses it: [host/][namespace/][kind/]model[:tag]."""

    host: str
    namespace: str
    model: str
    tag: str
    kind: str = ""

    @classmethod
    def parse(cls, text: str) -> ModelName | None:
        """ParseName with its defaults ("llama3.2" -> library llama3.2:latest); None if invalid."""
        host = namespace = kind = tag = ""
        if text.rfind(":") > text.rfind("/"):
            text, tag, _ = _cut_last(text, ":")
        rest, model, more = _cut_last(text, "/")
        if not more:
            model = text
        else:
            rest, middle, more = _cut_last(rest, "/")
            if not more:
                namespace = rest
            elif middle not in _KINDS:
                namespace, host = middle, _scheme_less(rest)
            else:
                kind = middle
                rest, namespace, more = _cut_last(rest, "/")
                if not more:
                    namespace = rest
                else:
                    host = _scheme_less(rest)
        name = cls(
            host or DEFAULT_HOST, namespace or DEFAULT_NAMESPACE, model, tag or DEFAULT_TAG, kind
        )
        parts = {"host": name.host, "namespace": name.namespace, "model": name.model}
        parts["tag"] = name.tag
        return name if all(_valid_part(k, v) for k, v in parts.items()) else None

    @property
    def _kind(self) -> str:
        return f"{self.kind}/" if self.kind else ""

    @property
    def key(self) -> str:
        """Case-insensitive identity (Ollama matches names with EqualFold)."""
        return f"{self.host}/{self.namespace}/{self._kind}{self.model}:{self.tag}".lower()

    @property
    def short(self) -> str:
        """DisplayShortest: "llama3.2:latest", "user/model:tag", or the full name."""
        if self.host.lower() != DEFAULT_HOST:
            return f"{self.host}/{self.namespace}/{self._kind}{self.model}:{self.tag}"
        if self.namespace.lower() != DEFAULT_NAMESPACE:
            return f"{self.namespace}/{self._kind}{self.model}:{self.tag}"
        return f"{self._kind}{self.model}:{self.tag}"


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

    @property
    def display(self) -> str:
        return self.name.short

    @property
    def capabilities(self) -> tuple[Capability, ...]:
        return (Capability.EMBEDDING,) if self.spec.embedding else (Capability.COMPLETION,)

    @property
    def file_size(self) -> int:
        """Bytes on disk: the spec's, else the runner size without the default KV cache."""
        if self.spec.file_size:
            return self.spec.file_size
        kv = self.spec.default_num_ctx * self.spec.kv_bytes_per_token
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

    def __init__(self, specs: tuple[OllamaModelSpec, ...], blobs_dir: Path, now: float) -> None:
        self._models: dict[str, CatalogModel] = {}
        for index, spec in enumerate(specs):
            name = ModelName.parse(spec.name)
            if name is None:
                raise ValueError(f"ollama.models[{index}].name: invalid model name {spec.name!r}")
            if name.key in self._models:
                raise ValueError(f"ollama.models[{index}].name: {spec.name!r} is listed twice")
            digest = spec.digest.removeprefix("sha256:") or _sha256(f"manifest:{name.key}")
            blob = _sha256(f"blob:{name.key}")
            self._models[name.key] = CatalogModel(
                spec=spec,
                name=name,
                digest=digest,
                blob_digest=blob,
                blob_path=str(blobs_dir / f"sha256-{blob}"),
                # One second apart, so /api/tags (newest first) lists them in spec order.
                modified_at=float(int(now) - index),
            )

    def find(self, text: str) -> CatalogModel | None:
        """The model a request names, or None (unknown, empty or malformed)."""
        name = ModelName.parse(text)
        return None if name is None else self._models.get(name.key)

    def __iter__(self) -> Iterator[CatalogModel]:
        return iter(self._models.values())

    def __len__(self) -> int:
        return len(self._models)
