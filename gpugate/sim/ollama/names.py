"""Model names as Ollama parses them (its `ParseName`), for the simulated Ollama."""

from __future__ import annotations

import re

import attrs

DEFAULT_HOST = "registry.ollama.ai"
DEFAULT_NAMESPACE = "library"
DEFAULT_TAG = "latest"


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
