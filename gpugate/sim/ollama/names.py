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
    def full(self) -> str:
        """Name.String: "registry.ollama.ai/library/llama3.2:latest" (in some errors)."""
        return f"{self.host}/{self.namespace}/{self._kind}{self.model}:{self.tag}"

    @property
    def short(self) -> str:
        """DisplayShortest: "llama3.2:latest", "user/model:tag", or the full name."""
        if self.host.lower() != DEFAULT_HOST:
            return f"{self.host}/{self.namespace}/{self._kind}{self.model}:{self.tag}"
        if self.namespace.lower() != DEFAULT_NAMESPACE:
            return f"{self.namespace}/{self._kind}{self.model}:{self.tag}"
        return f"{self._kind}{self.model}:{self.tag}"


GO_SPACE = (
    "\t\n\v\f\r \x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008"
    "\u2009\u200a\u2028\u2029\u202f\u205f\u3000"
)
"""unicode.IsSpace, what strings.TrimSpace trims (Python's strip takes more: \\x1c-\\x1f)."""


def go_trim_space(text: str) -> str:
    return text.strip(GO_SPACE)


def _source_suffix(raw: str) -> tuple[str, str]:
    """parseSourceSuffix (internal/modelref): the base and "cloud", "local" or ""."""
    index = raw.rfind(":")
    if index >= 0:
        suffix_raw = go_trim_space(raw[index + 1 :])
        suffix = suffix_raw.lower()
        if suffix in ("cloud", "local"):
            return raw[:index], suffix
        if "/" not in suffix_raw and suffix.endswith("-cloud"):
            return raw[: index + 1] + suffix_raw[: -len("-cloud")], "cloud"
    return raw, ""


@attrs.frozen
class ModelRef:
    """modelref.ParseRef: the name without surrounding space or a :local/:cloud suffix."""

    base: str
    source: str

    @classmethod
    def parse(cls, raw: str) -> ModelRef | None:
        """None where Ollama refuses the reference (empty, or both suffixes)."""
        raw = go_trim_space(raw)
        if not raw:
            return None
        base, source = _source_suffix(raw)
        if source and _source_suffix(base)[1]:
            return None
        return cls(base, source)
