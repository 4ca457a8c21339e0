"""Model names resolved as Ollama resolves them (types/model/name.go ParseName).

`m`, `M`, `m:latest`, `library/m:latest` and `registry.ollama.ai/library/m:latest` are
the same model to Ollama: missing parts take the defaults, and names compare with
EqualFold. The gate keys a model by its canonical name: Ollama's DisplayShortest (the
form /api/ps and clients show: `gemma3:12b`, `bge-m3:latest`, `team/m:tag`) in lower case.
"""

from __future__ import annotations

import enum
import functools
import re

import attrs

DEFAULT_HOST = "registry.ollama.ai"
DEFAULT_NAMESPACE = "library"
DEFAULT_TAG = "latest"
KINDS = frozenset({"skill", "agent", "mcp"})
_MISSING = "!MISSING!"
"""What Ollama puts for a part a separator promised but that is empty: never valid."""


@attrs.frozen
class ModelName:
    host: str
    namespace: str
    kind: str
    model: str
    tag: str

    def display(self) -> str:
        """DisplayShortest: default host and namespace left out, tag always shown."""
        prefix = ""
        if self.host.lower() != DEFAULT_HOST:
            prefix = f"{self.host}/{self.namespace}/"
        elif self.namespace.lower() != DEFAULT_NAMESPACE:
            prefix = f"{self.namespace}/"
        if self.kind:
            prefix += f"{self.kind}/"
        return f"{prefix}{self.model}:{self.tag}"


def _cut_promised(text: str, sep: str) -> tuple[str, str, bool]:
    index = text.rfind(sep)
    if index < 0:
        return text, "", False
    return text[:index] or _MISSING, text[index + len(sep) :] or _MISSING, True


def _host(text: str) -> str:
    scheme, sep, host = text.partition("://")
    return host if sep else scheme


def parse_name(text: str) -> ModelName | None:
    """ParseName, then IsValid: the name with Ollama's defaults, or None if invalid."""
    host = namespace = kind = tag = ""
    if text.rfind(":") > text.rfind("/"):
        text, tag, _ = _cut_promised(text, ":")
    rest, model, promised = _cut_promised(text, "/")
    if not promised:
        model = text
    else:
        rest, kind, promised = _cut_promised(rest, "/")
        if not promised:
            # namespace/model (what every release does with two parts; one source
            # snapshot with skill/agent kinds drops the namespace here, taken as a slip)
            namespace, kind = rest, ""
        elif kind not in KINDS:
            namespace, kind, host = kind, "", _host(rest)
        else:
            rest, namespace, promised = _cut_promised(rest, "/")
            if not promised:
                namespace = rest
            else:
                host = _host(rest)
    name = ModelName(
        host or DEFAULT_HOST, namespace or DEFAULT_NAMESPACE, kind, model, tag or DEFAULT_TAG
    )
    valid = (
        _valid(name.host, 350, host=True)
        and _valid(name.namespace, 80, dots=False)
        and (not name.kind or name.kind in KINDS)
        and _valid(name.model, 80)
        and _valid(name.tag, 80)
    )
    return name if valid else None


_PART = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*")
_NAMESPACE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_-]*")
_HOST = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.:-]*")


def _valid(part: str, longest: int, *, host: bool = False, dots: bool = True) -> bool:
    """isValidPart: a letter, digit or _ first, then those or - _ . (and : in a host)."""
    if not part.isascii() or not 1 <= len(part) <= longest:
        return False
    pattern = _HOST if host else _PART if dots else _NAMESPACE
    return pattern.fullmatch(part) is not None


_GO_SPACE = (
    "\t\n\v\f\r \x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006"
    "\u2007\u2008\u2009\u200a\u2028\u2029\u202f\u205f\u3000"
)
"""unicode.IsSpace, which strings.TrimSpace trims (Python's strip also takes \\x1c-\\x1f)."""


def go_trim_space(text: str) -> str:
    """strings.TrimSpace."""
    return text.strip(_GO_SPACE)


class Source(enum.Enum):
    """Where a model reference asks the model to run (internal/modelref ParseRef)."""

    UNSPECIFIED = "unspecified"
    LOCAL = "local"
    CLOUD = "cloud"


@attrs.frozen
class ModelRef:
    """A request's model as Ollama's handlers resolve it (server/model_resolver.go)."""

    source: Source
    name: str | None
    """The canonical name of the base, None where Ollama finds no valid name."""


def _source_suffix(raw: str) -> tuple[str, Source]:
    """modelref.parseSourceSuffix."""
    index = raw.rfind(":")
    if index >= 0:
        suffix_raw = go_trim_space(raw[index + 1 :])
        suffix = suffix_raw.lower()
        if suffix == "cloud":
            return raw[:index], Source.CLOUD
        if suffix == "local":
            return raw[:index], Source.LOCAL
        if "/" not in suffix_raw and suffix.endswith("-cloud"):
            return raw[: index + 1] + suffix_raw[: -len("-cloud")], Source.CLOUD
    return raw, Source.UNSPECIFIED


@functools.lru_cache(maxsize=4096)
def model_ref(raw: str) -> ModelRef | None:
    """parseAndValidateModelRef: None where it fails (an empty name after trimming, both
    :local and :cloud, an invalid name); a cloud source is never loaded here."""
    raw = go_trim_space(raw)
    if not raw:
        return None
    base, source = _source_suffix(raw)
    if source is not Source.UNSPECIFIED and _source_suffix(base)[1] is not Source.UNSPECIFIED:
        return None  # "use either :local or :cloud, not both"
    name = canonical_name(base)
    return None if name is None else ModelRef(source, name)


@functools.lru_cache(maxsize=4096)
def canonical_name(text: str) -> str | None:
    """The gate's key for a model name; None where Ollama finds no valid name."""
    name = parse_name(text)
    return None if name is None else name.display().lower()


def written_name(raw: str) -> str | None:
    """A name as a handler that does not fold case looks it up: parsed and trimmed as
    `model_ref` does, its case kept (None where Ollama finds no valid local name)."""
    raw = go_trim_space(raw)
    base, source = _source_suffix(raw)
    if source is Source.CLOUD:
        return None
    name = parse_name(base)
    return None if name is None else name.display()
