"""The Go request types Ollama v0.24.0 decodes each demand route's body into, as data.

api/types.go (GenerateRequest, ChatRequest, EmbedRequest, EmbeddingRequest and the types
they hold) and openai/openai.go (ChatCompletionRequest, CompletionRequest, EmbedRequest,
ImageGenerationRequest, ImageEditRequest).
"""

from __future__ import annotations

from gpugate.runtimes.ollama.gotypes import (
    ANY,
    BOOL,
    BYTES,
    FLOAT32,
    FLOAT64,
    INT,
    INT32,
    RAW,
    STRING,
    GoKind,
    GoType,
    fits_any,
    map_of,
    pointer,
    slice_of,
    struct,
)
from gpugate.runtimes.ollama.keepalive import KeepAliveError, parse_go_duration

_THINK_LEVELS = frozenset({"high", "medium", "low", "max"})


def _duration_accepts(value: object) -> bool:
    """api.Duration.UnmarshalJSON: a float64 number or a ParseDuration string."""
    if type(value) is str:
        try:
            parse_go_duration(value)
        except KeepAliveError:
            return False
        return True
    return type(value) in (int, float) and fits_any(value)


def _think_accepts(value: object) -> bool:
    """ThinkValue.UnmarshalJSON: a bool, or one of the level strings."""
    return type(value) is bool or (type(value) is str and value in _THINK_LEVELS)


def _property_type_accepts(value: object) -> bool:
    """PropertyType.UnmarshalJSON: a string, or an array of strings (nulls are no-ops)."""
    if type(value) is str:
        return True
    return type(value) is list and all(item is None or type(item) is str for item in value)


def _ordered_map(elem: GoType, name: str) -> GoType:
    """orderedmap.Map[string, V]: its UnmarshalJSON walks an object (jsonparser.ObjectEach
    refuses anything else) and json.Unmarshals each value into V."""
    return GoType(GoKind.CUSTOM, name, accepts=lambda v: type(v) is tuple, parts=(map_of(elem),))


DURATION = pointer(GoType(GoKind.CUSTOM, "api.Duration", accepts=_duration_accepts))
THINK = pointer(GoType(GoKind.CUSTOM, "api.ThinkValue", accepts=_think_accepts))
PROPERTY_TYPE = GoType(GoKind.CUSTOM, "api.PropertyType", accepts=_property_type_accepts)
BOOL_PTR = pointer(BOOL)
INT_PTR = pointer(INT)
OPTIONS = map_of(ANY)

TOOL_PROPERTY = struct("api.ToolProperty")
TOOL_PROPERTY.field("anyOf", slice_of(TOOL_PROPERTY))
TOOL_PROPERTY.field("type", PROPERTY_TYPE)
TOOL_PROPERTY.field("items", ANY)
TOOL_PROPERTY.field("description", STRING)
TOOL_PROPERTY.field("enum", slice_of(ANY))
TOOL_PROPERTY.field("properties", pointer(_ordered_map(TOOL_PROPERTY, "api.ToolPropertiesMap")))
TOOL_PROPERTY.field("required", slice_of(STRING))

TOOL = struct(
    "api.Tool",
    type=STRING,
    items=ANY,
    function=struct(
        "api.ToolFunction",
        name=STRING,
        description=STRING,
        parameters=struct(
            "api.ToolFunctionParameters",
            type=STRING,
            items=ANY,
            required=slice_of(STRING),
            properties=pointer(_ordered_map(TOOL_PROPERTY, "api.ToolPropertiesMap")),
        ),
    ),
)
TOOL.fields["function"].fields["parameters"].field("$defs", ANY)

TOOL_CALL = struct(
    "api.ToolCall",
    id=STRING,
    function=struct(
        "api.ToolCallFunction",
        index=INT,
        name=STRING,
        arguments=_ordered_map(ANY, "api.ToolCallFunctionArguments"),
    ),
)

# api.Message.UnmarshalJSON (api/types.go:223) decodes into a new Alias value each time.
MESSAGE = struct(
    "api.Message",
    role=STRING,
    content=STRING,
    thinking=STRING,
    images=slice_of(BYTES),
    tool_calls=slice_of(TOOL_CALL),
    tool_name=STRING,
    tool_call_id=STRING,
)
MESSAGE.fresh = True

_INFERENCE = {
    "_debug_render_only": BOOL,
    "logprobs": BOOL,
    "top_logprobs": INT,
    "think": THINK,
    "truncate": BOOL_PTR,
    "shift": BOOL_PTR,
    "stream": BOOL_PTR,
    "format": RAW,
    "keep_alive": DURATION,
    "options": OPTIONS,
    "model": STRING,
}

GENERATE = struct(
    "api.GenerateRequest",
    prompt=STRING,
    suffix=STRING,
    system=STRING,
    template=STRING,
    context=slice_of(INT),
    raw=BOOL,
    images=slice_of(BYTES),
    width=INT32,
    height=INT32,
    steps=INT32,
    **_INFERENCE,
)
CHAT = struct("api.ChatRequest", messages=slice_of(MESSAGE), tools=slice_of(TOOL), **_INFERENCE)
EMBED = struct(
    "api.EmbedRequest",
    model=STRING,
    input=ANY,
    keep_alive=DURATION,
    truncate=BOOL_PTR,
    dimensions=INT,
    options=OPTIONS,
)
EMBEDDING = struct(
    "api.EmbeddingRequest", model=STRING, prompt=STRING, keep_alive=DURATION, options=OPTIONS
)

STREAM_OPTIONS = pointer(struct("openai.StreamOptions", include_usage=BOOL))
OPENAI_MESSAGE = struct(
    "openai.Message",
    role=STRING,
    content=ANY,
    reasoning=STRING,
    tool_calls=slice_of(
        struct(
            "openai.ToolCall",
            id=STRING,
            index=INT,
            type=STRING,
            function=struct("openai.ToolCall.Function", name=STRING, arguments=STRING),
        )
    ),
    name=STRING,
    tool_call_id=STRING,
)
OPENAI_CHAT = struct(
    "openai.ChatCompletionRequest",
    model=STRING,
    messages=slice_of(OPENAI_MESSAGE),
    stream=BOOL,
    stream_options=STREAM_OPTIONS,
    max_tokens=INT_PTR,
    seed=INT_PTR,
    stop=ANY,
    temperature=pointer(FLOAT64),
    frequency_penalty=pointer(FLOAT64),
    presence_penalty=pointer(FLOAT64),
    top_p=pointer(FLOAT64),
    response_format=pointer(
        struct(
            "openai.ResponseFormat",
            type=STRING,
            json_schema=pointer(struct("openai.JsonSchema", schema=RAW)),
        )
    ),
    tools=slice_of(TOOL),
    reasoning=pointer(struct("openai.Reasoning", effort=STRING)),
    reasoning_effort=pointer(STRING),
    logprobs=BOOL_PTR,
    top_logprobs=INT,
    _debug_render_only=BOOL,
)
OPENAI_COMPLETION = struct(
    "openai.CompletionRequest",
    model=STRING,
    prompt=STRING,
    frequency_penalty=FLOAT32,
    max_tokens=INT_PTR,
    presence_penalty=FLOAT32,
    seed=INT_PTR,
    stop=ANY,
    stream=BOOL,
    stream_options=STREAM_OPTIONS,
    temperature=pointer(FLOAT32),
    top_p=FLOAT32,
    suffix=STRING,
    logprobs=INT_PTR,
    _debug_render_only=BOOL,
)
OPENAI_EMBED = struct(
    "openai.EmbedRequest", input=ANY, model=STRING, dimensions=INT, encoding_format=STRING
)
# openai/openai.go:785 and :881. Nothing is nested: Seed's pointer is the only indirection.
INT64 = GoType(GoKind.INT, "int64")
OPENAI_IMAGE_GENERATION = struct(
    "openai.ImageGenerationRequest",
    model=STRING,
    prompt=STRING,
    n=INT,
    size=STRING,
    response_format=STRING,
    seed=pointer(INT64),
)
OPENAI_IMAGE_EDIT = struct(
    "openai.ImageEditRequest",
    model=STRING,
    prompt=STRING,
    image=STRING,
    size=STRING,
    seed=pointer(INT64),
)
REQUEST_TYPES = {
    "/api/generate": GENERATE,
    "/api/chat": CHAT,
    "/api/embed": EMBED,
    "/api/embeddings": EMBEDDING,
    "/v1/chat/completions": OPENAI_CHAT,
    "/v1/completions": OPENAI_COMPLETION,
    "/v1/embeddings": OPENAI_EMBED,
    "/v1/images/generations": OPENAI_IMAGE_GENERATION,
    "/v1/images/edits": OPENAI_IMAGE_EDIT,
}
"""/v1/responses and /v1/messages are in ollama_requests_compat."""
