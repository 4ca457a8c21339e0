"""What an Ollama request asks of its model, checked against the model before any lease.

Some of Ollama's refusals depend on the model, not on the body alone: a handler resolves the
model, then `scheduleRunner` refuses a model that lacks a capability the request needs
(`completion` for generate and chat, `insert` for a suffix, `tools` for tools, `thinking` for
a request that asks to think), and a remote model is proxied, never loaded. The body says
what it needs (`Needs`, from `classify`); the model's `/api/show` says what it has
(`ModelFacts`); `refused` decides, as the handler would, before the gate leases anything.

Line numbers are Ollama v0.24.0's. Each /v1 route is read as its middleware converts it
into the handler's request (server/routes.go:1752-1765 names the handler of each route).
"""

from __future__ import annotations

import enum
import re
from collections.abc import Callable

import attrs

from gpugate.runtimes.ollama.gojson import Bound, go_string
from gpugate.runtimes.ollama.govalues import decode_bound
from gpugate.runtimes.ollama.names import go_trim_space
from gpugate.runtimes.ollama.preload import chat_completion_effort, options_refused
from gpugate.runtimes.ollama.requests_compat import ANTHROPIC, RESPONSES

COMPLETION = "completion"
INSERT = "insert"
TOOLS = "tools"
THINKING = "thinking"
IMAGE = "image"

MAX_IMAGE_SIDE = 4096
"""handleImageGenerate's maxDimension (server/routes.go:2762)."""
_THINK_LEVELS = frozenset({"high", "medium", "low", "max"})


class Handler(enum.Enum):
    """The handler a route ends in (the /v1 middlewares convert into one of these)."""

    GENERATE = "generate"
    """GenerateHandler: an image-generation model needs only `image`."""
    CHAT = "chat"
    EMBED = "embed"
    """EmbedHandler and EmbeddingsHandler: no capability is checked."""


@attrs.frozen
class Needs:
    """What a request needs of its model, read from its body."""

    handler: Handler
    capabilities: tuple[str, ...] = ()
    """Beyond the handler's own: `insert` (a suffix), `tools` (tools given)."""
    think: bool = False
    """The request asks to think (ThinkValue.Bool): refused by a model without `thinking`."""
    relax_thinking: bool = False
    """The Anthropic middleware's conversion: asking to think is no refusal."""
    image_too_large: bool = False
    """A width or height over 4096: refused by an image model (server/routes.go:2763),
    which GenerateHandler hands the request to before any other check of the body."""
    exact_name: str | None = None
    """The model's name as written, where the handler looks it up without folding its case
    (EmbeddingsHandler): no installed model by exactly that name is Ollama's 404."""
    refused_unless_image: bool = False
    """GenerateHandler refuses `raw` with a template, system or context (routes.go:373) and
    options of the wrong type (scheduleRunner, :137), but only after it has handed an image
    model's request to handleImageGenerate (:368), which loads it without either check."""


@attrs.frozen
class ModelFacts:
    """What Ollama's `/api/show` says of an installed model."""

    capabilities: frozenset[str]
    remote: bool = False
    """A stub of a remote model (`remote_host`): Ollama proxies it and loads nothing."""
    retired: bool = False
    """The old llama3.2-vision (family `mllama` with a projector, `/api/show`'s
    `details.families` and `projector_info`): scheduleRunner refuses it on every route
    (server/routes.go:157)."""
    layers: int = 0
    """Its block count (`model_info`'s `<arch>.block_count`; 0: not said): llama-server
    splits a model across GPUs in whole layers."""


def refused(needs: Needs, facts: ModelFacts) -> bool:
    """Whether Ollama refuses (or proxies) this request for this model before loading."""
    if facts.remote or facts.retired:
        return True
    caps = facts.capabilities
    if needs.handler is Handler.EMBED:
        return False  # routes.go:741 and :896 schedule with no capability
    if needs.handler is Handler.GENERATE and IMAGE in caps:
        # routes.go:368 hands an image model to handleImageGenerate, which checks only the
        # size (:2763) and schedules for `image` alone (:2769): no suffix, think or raw check.
        return needs.image_too_large
    if needs.refused_unless_image:
        return True
    if any(cap not in caps for cap in (COMPLETION, *needs.capabilities)):
        return True  # scheduleRunner's CheckCapabilities (routes.go:161)
    # routes.go:404-415 (generate) and :2353-2370 (chat): only a model without `thinking`
    # refuses a request that asks to think, and chat relaxes it for the Anthropic route.
    return needs.think and THINKING not in caps and not needs.relax_thinking


# -- what each route's body needs --------------------------------------------------------


def asks_to_think(value: object) -> bool:
    """ThinkValue.Bool (api/types.go:1139): true, or one of the level strings."""
    return value is True or (type(value) is str and value in _THINK_LEVELS)


def _too_large(width: object, height: object) -> bool:
    return any(type(n) is int and n > MAX_IMAGE_SIDE for n in (width, height))


def generate_needs(bound: Bound) -> Needs:
    """GenerateHandler: `insert` when the suffix is not empty (routes.go:399-402), think
    (:411), and an image model's size check on width and height (:2763)."""
    get = bound.values.get  # the dict's own get: this reads eight fields
    raw_conflict = get("raw") is True and bool(get("template") or get("system") or get("context"))
    return Needs(
        Handler.GENERATE,
        (INSERT,) if get("suffix") else (),
        think=asks_to_think(get("think")),
        image_too_large=_too_large(get("width"), get("height")),
        refused_unless_image=raw_conflict or options_refused(get("options")),
    )


def chat_needs(bound: Bound) -> Needs:
    """ChatHandler: `tools` when any are given (routes.go:2348-2351), think (:2360)."""
    # A slice field holds the last array that was not null: its length is Go's len().
    return Needs(
        Handler.CHAT,
        (TOOLS,) if bound.get("tools") else (),
        think=asks_to_think(bound.get("think")),
    )


EMBED_NEEDS = Needs(Handler.EMBED)


def chat_completion_needs(bound: Bound) -> Needs:
    """ChatMiddleware → ChatHandler (routes.go:1752): FromChatRequest passes the tools on
    (openai/openai.go:652) and makes the effort the think value (:625-643): a level asks
    to think, "none" is false."""
    return Needs(
        Handler.CHAT,
        (TOOLS,) if bound.get("tools") else (),
        think=chat_completion_effort(bound) in _THINK_LEVELS,
    )


def completion_needs(bound: Bound) -> Needs:
    """CompletionsMiddleware → GenerateHandler (routes.go:1753): FromCompleteRequest keeps
    the suffix (openai/openai.go:777) and sets no think, width or height."""
    return Needs(Handler.GENERATE, (INSERT,) if bound.get("suffix") else ())


def image_needs(bound: Bound) -> Needs:
    """ImageGenerationsMiddleware and ImageEditsMiddleware → GenerateHandler (routes.go:
    1759-1760): From{ImageGeneration,ImageEdit}Request set width and height from `size`
    (openai/openai.go:813-819, :906-912) and nothing else a capability depends on."""
    size = bound.get("size")
    scanned = scan_size(go_string(size)) if type(size) is str else None
    return Needs(Handler.GENERATE, image_too_large=scanned is not None and _too_large(*scanned))


def responses_needs(bound: Bound) -> Needs:
    """ResponsesMiddleware → ChatHandler (routes.go:1757): FromResponsesRequest converts
    every tool (openai/responses.go:541-548) and makes reasoning.effort the think value
    (:528-538): a level asks to think, "none" is false."""
    reasoning = decode_bound(bound, RESPONSES, "reasoning") or {}
    return Needs(
        Handler.CHAT,
        (TOOLS,) if bound.get("tools") else (),
        think=reasoning.get("effort", "") in _THINK_LEVELS,
    )


def messages_needs(bound: Bound) -> Needs:
    """AnthropicMessagesMiddleware → ChatHandler (routes.go:1765), with relax_thinking
    set (middleware/anthropic.go:846)."""
    tools = [tool or {} for tool in decode_bound(bound, ANTHROPIC, "tools") or ()]
    builtin = any(str(tool.get("type", "")).startswith("web_search") for tool in tools)
    # anthropic/anthropic.go:364-378: a custom tool named web_search is dropped beside a
    # built-in one; every other tool is converted.
    kept = [
        tool
        for tool in tools
        if not builtin
        or str(tool.get("type", "")).startswith("web_search")
        or tool.get("name") != "web_search"
    ]
    return Needs(
        Handler.CHAT,
        (TOOLS,) if kept else (),
        think=_messages_think(bound),
        relax_thinking=True,
    )


def _messages_think(bound: Bound) -> bool:
    """anthropic/anthropic.go:380-400: thinking.type "enabled" or "disabled" decides; else
    output_config.effort (trimmed, lower-cased, "xhigh" read as "high") if a level."""
    thinking = decode_bound(bound, ANTHROPIC, "thinking")
    if thinking is not None:
        kind = thinking.get("type", "")
        if kind in ("enabled", "disabled"):
            return kind == "enabled"
    config = decode_bound(bound, ANTHROPIC, "output_config")
    if config is None:
        return False
    effort = _go_lower(go_trim_space(go_string(config.get("effort", ""))))
    return effort == "xhigh" or effort in _THINK_LEVELS


def _go_lower(text: str) -> str:
    """strings.ToLower, as far as the result can equal an ASCII word: Go lowers U+0130 to
    a plain i by its simple mapping, where Python's adds a combining dot."""
    return text.replace("\u0130", "i").lower()


TRANSCRIPTION_NEEDS = Needs(Handler.CHAT)
"""TranscriptionMiddleware → ChatHandler (routes.go:1762): FromTranscriptionRequest
(openai/openai.go:857) gives no tools and no think."""

NEEDS: dict[str, Callable[[Bound], Needs]] = {
    "/api/generate": generate_needs,
    "/api/chat": chat_needs,
    "/api/embed": lambda _bound: EMBED_NEEDS,
    "/api/embeddings": lambda _bound: EMBED_NEEDS,
    "/v1/chat/completions": chat_completion_needs,
    "/v1/completions": completion_needs,
    "/v1/embeddings": lambda _bound: EMBED_NEEDS,  # EmbeddingsMiddleware → EmbedHandler
    "/v1/responses": responses_needs,
    "/v1/messages": messages_needs,
    "/v1/images/generations": image_needs,
    "/v1/images/edits": image_needs,
}

# -- fmt.Sscanf(size, "%dx%d", &w, &h) into two int32s -----------------------------------

_FMT_SPACE = frozenset(
    "\t\n\v\f\r \x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006"
    "\u2007\u2008\u2009\u200a\u2028\u2029\u202f\u205f\u3000"
)
"""fmt's isSpace table (unicode.White_Space)."""
_GO_INT = re.compile(r"[+-]?[0-9]+")
_INT32 = 2**31


def _scan_int32(text: str, pos: int) -> tuple[int, int] | None:
    """One %d into an int32 (fmt scanInt): spaces skipped but a newline is an error (Sscanf
    is not Sscan), an optional sign, ASCII digits, ParseInt, then the 32-bit overflow
    check. The value and the position after it; None where Go errs."""
    while pos < len(text) and text[pos] in _FMT_SPACE:
        if text[pos] == "\n":
            return None  # "unexpected newline"
        pos += 1
    found = _GO_INT.match(text, pos)
    if found is None:
        return None  # EOF, or "expected integer"
    value = int(found.group())
    if not -_INT32 <= value < _INT32:
        return None  # ParseInt's range error, or "integer overflow on token"
    return value, found.end()


def scan_size(text: str) -> tuple[int, int] | None:
    """Width and height where `fmt.Sscanf(text, "%dx%d", &w, &h)` succeeds, else None (the
    converters then leave both 0). The literal x must follow the first number at once;
    whatever follows the second is not read."""
    first = _scan_int32(text, 0)
    if first is None or not text.startswith("x", first[1]):
        return None
    second = _scan_int32(text, first[1] + 1)
    if second is None:
        return None
    return first[0], second[0]
