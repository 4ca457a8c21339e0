"""What the Ollama adapter reads a demand route's body into, what it refuses unread, and
what it needs of its model.

Each route's body is bound to its own Go request type and then judged by the checks its
handler (and, for /v1, its middleware) makes before anything is scheduled; what is left to
judge depends on the model (ollama_needs).
"""

from __future__ import annotations

from collections.abc import Callable

import attrs

from gpugate.runtimes.ollama.gojson import Bound, go_string
from gpugate.runtimes.ollama.gotypes import GoType
from gpugate.runtimes.ollama.names import Source, go_trim_space, model_ref
from gpugate.runtimes.ollama.needs import NEEDS, Needs
from gpugate.runtimes.ollama.preload import PRELOAD
from gpugate.runtimes.ollama.preload_compat import messages_refused, responses_refused
from gpugate.runtimes.ollama.requests import REQUEST_TYPES
from gpugate.runtimes.ollama.requests_compat import ANTHROPIC, RESPONSES


@attrs.frozen
class RouteReader:
    """A demand route's request type, its pre-load refusals and what it needs of its model."""

    kind: GoType
    refused: Callable[[Bound], bool]
    needs: Callable[[Bound], Needs]


READERS = {
    path: RouteReader(kind, PRELOAD[path], NEEDS[path]) for path, kind in REQUEST_TYPES.items()
}
READERS["/v1/responses"] = RouteReader(RESPONSES, responses_refused, NEEDS["/v1/responses"])
READERS["/v1/messages"] = RouteReader(ANTHROPIC, messages_refused, NEEDS["/v1/messages"])

# The routes behind cloudPassthroughMiddleware (server/routes.go:1752-1765): it inflates a
# body sent with `Content-Encoding: zstd` before anything reads it (server/cloud_proxy.go:80).
ZSTD_ROUTES = frozenset(
    {
        "/v1/chat/completions",
        "/v1/completions",
        "/v1/embeddings",
        "/v1/responses",
        "/v1/messages",
        "/v1/images/generations",
        "/v1/images/edits",
    }
)
_ZSTD_FRAME = b"\x28\xb5\x2f\xfd"
_SKIPPABLE_TAIL = b"\x2a\x4d\x18"


def zstd_syntax_error(path: str, body: bytes) -> str | None:
    """Go's syntax error for a body that starts like a zstd stream, on a route whose
    middleware would inflate it under `Content-Encoding: zstd` (cloud_proxy.go:80).

    The gate does not inflate it and so cannot read it: it answers what Ollama answers
    the same bytes sent without that header, and never lets them through unread.
    """
    if path not in ZSTD_ROUTES:
        return None
    skippable = len(body) >= 4 and 0x50 <= body[0] <= 0x5F and body[1:4] == _SKIPPABLE_TAIL
    if not body.startswith(_ZSTD_FRAME) and not skippable:
        return None
    # '[' opens an array and the next byte is the offender; any other first byte is.
    offender = chr(body[1]) if body[0] == 0x5B else chr(body[0])
    quoted = "\\\\" if offender == "\\" else offender
    return f"invalid character '{quoted}' looking for beginning of value"


def cloud_passthrough(bound: Bound) -> bool:
    """cloudPassthroughMiddleware (server/cloud_proxy.go:73): json.Unmarshal of the whole
    body into map[string]json.RawMessage, the exact key "model" (last wins), a string
    whose reference is a cloud one: proxied to the cloud, nothing loads here."""
    text = bound.text
    if text[bound.close + 1 :].strip(" \t\n\r"):
        return False  # Unmarshal refuses trailing data; the middleware reads on
    model = dict(bound.pairs).get("model")
    if not isinstance(model, str) or not go_trim_space(go_string(model)):
        return False
    ref = model_ref(go_string(model))
    return ref is not None and ref.source is Source.CLOUD


def is_unload(path: str, bound: Bound) -> bool:
    """Ollama's unload shortcut: keep_alive 0 with nothing to generate."""
    if path == "/api/generate":
        return not bound.get("prompt")
    if path == "/api/chat":
        return not bound.get("messages")
    return False  # embed/embeddings with keep_alive 0 load, then expire
