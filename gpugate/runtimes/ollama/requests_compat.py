"""The request types of Ollama v0.24.0's /v1/responses and /v1/messages, as data.

openai/responses.go (ResponsesRequest and the input items its UnmarshalJSON methods read)
and anthropic/anthropic.go (MessagesRequest, MessageParam, ContentBlock). The hand-written
UnmarshalJSON methods decode one value several times (a peek at `type`, then the concrete
type); each of those decodes can fail, so each is a check here.
"""

from __future__ import annotations

from gpugate.runtimes.ollama.gojson import GoJsonError
from gpugate.runtimes.ollama.gotypes import (
    ANY,
    BOOL,
    FLOAT64,
    INT,
    RAW,
    STRING,
    GoKind,
    GoType,
    check,
    map_of,
    pointer,
    slice_of,
    struct,
)
from gpugate.runtimes.ollama.govalues import GoSlice, decode, field_name
from gpugate.runtimes.ollama.requests import BOOL_PTR, INT_PTR, TOOL_CALL

_PEEK = struct("type peek", type=STRING)
_ITEM_PEEK = struct("item peek", type=STRING, role=STRING)


def last_member(pairs: object, kind: GoType, name: str) -> tuple[bool, object]:
    """Whether a member decodes into field `name`, and the last such member's value."""
    found, value = False, None
    for key, member in pairs if type(pairs) is tuple else ():
        if field_name(kind, key) == name:
            found, value = True, member
    return found, value


def _fits(value: object, kind: GoType) -> bool:
    try:
        check(value, kind)
    except GoJsonError:
        return False
    return True


_CONTENT_TYPES = {
    "input_text": struct("openai.ResponsesTextContent", type=STRING, text=STRING),
    "input_image": struct(
        "openai.ResponsesImageContent", type=STRING, detail=STRING, file_id=STRING, image_url=STRING
    ),
    "output_text": struct("openai.ResponsesOutputTextContent", type=STRING, text=STRING),
    "input_file": struct(
        "openai.ResponsesFileContent",
        type=STRING,
        file_data=STRING,
        file_id=STRING,
        file_url=STRING,
        filename=STRING,
    ),
}


def content_kind(item: object) -> GoType | None:
    """unmarshalResponsesContent (responses.go:106): the concrete type, None if refused."""
    if (item is not None and type(item) is not tuple) or not _fits(item, _PEEK):
        return None
    kind = _CONTENT_TYPES.get(_peeked(item, _PEEK, "type"))
    return kind if kind is not None and _fits(item, kind) else None


def _peeked(item: object, kind: GoType, name: str) -> str:
    """A string field of a fresh struct decoded from `item` ("" when absent or null)."""
    if item is None:
        return ""
    value = decode(item, kind).get(name)
    return value if type(value) is str else ""


def _content_list_accepts(raw: object) -> bool:
    """A RawMessage that is a string (or null), else an array of content items."""
    if raw is None or type(raw) is str:
        return True
    return type(raw) is list and all(content_kind(item) is not None for item in raw)


_MESSAGE_AUX = struct("openai.ResponsesInputMessage aux", type=STRING, role=STRING, content=RAW)
_OUTPUT_AUX = struct("openai.ResponsesFunctionCallOutput aux", type=STRING, call_id=STRING)
_OUTPUT_AUX.field("output", RAW)
ITEM_TYPES = {
    "message": _MESSAGE_AUX,
    "function_call": struct(
        "openai.ResponsesFunctionCall",
        id=STRING,
        type=STRING,
        call_id=STRING,
        name=STRING,
        arguments=STRING,
    ),
    "function_call_output": _OUTPUT_AUX,
    "reasoning": struct(
        "openai.ResponsesReasoningInput",
        id=STRING,
        type=STRING,
        summary=slice_of(struct("openai.ResponsesReasoningSummary", type=STRING, text=STRING)),
        encrypted_content=STRING,
    ),
}
ITEM_CONTENT = {"message": "content", "function_call_output": "output"}


def item_type(item: object) -> str | None:
    """unmarshalResponsesInputItem (responses.go:259): the item's type after the
    shorthand ({"role": ...} is a message), None where it is refused."""
    if (item is not None and type(item) is not tuple) or not _fits(item, _ITEM_PEEK):
        return None
    kind = _peeked(item, _ITEM_PEEK, "type")
    if kind == "" and _peeked(item, _ITEM_PEEK, "role") != "":
        kind = "message"
    concrete = ITEM_TYPES.get(kind)
    if concrete is None or not _fits(item, concrete):
        return None
    content = ITEM_CONTENT.get(kind)
    if content is not None:
        # The RawMessage keeps the last member; a null one is the text "null", a string.
        found, raw = last_member(item, concrete, content)
        if found and not _content_list_accepts(raw):
            return None
    return kind


def _input_accepts(value: object) -> bool:
    """ResponsesInput.UnmarshalJSON (responses.go:318): a string, or an array of items."""
    if type(value) is str:
        return True
    return type(value) is list and all(item_type(item) is not None for item in value)


RESPONSES_INPUT = GoType(GoKind.CUSTOM, "openai.ResponsesInput", accepts=_input_accepts)
RESPONSES_TOOL = struct(
    "openai.ResponsesTool",
    type=STRING,
    name=STRING,
    description=pointer(STRING),
    strict=BOOL_PTR,
    parameters=map_of(ANY),
)
RESPONSES = struct(
    "openai.ResponsesRequest",
    model=STRING,
    background=BOOL,
    conversation=RAW,
    include=slice_of(STRING),
    input=RESPONSES_INPUT,
    instructions=STRING,
    max_output_tokens=INT_PTR,
    reasoning=struct(
        "openai.ResponsesReasoning", effort=STRING, generate_summary=STRING, summary=STRING
    ),
    temperature=pointer(FLOAT64),
    text=pointer(
        struct(
            "openai.ResponsesText",
            format=pointer(
                struct(
                    "openai.ResponsesTextFormat",
                    type=STRING,
                    name=STRING,
                    schema=RAW,
                    strict=BOOL_PTR,
                )
            ),
        )
    ),
    top_p=pointer(FLOAT64),
    truncation=pointer(STRING),
    tools=slice_of(RESPONSES_TOOL),
    stream=BOOL_PTR,
)

# -- /v1/messages (anthropic/anthropic.go) ----------------------------------------------

IMAGE_SOURCE = struct(
    "anthropic.ImageSource", type=STRING, media_type=STRING, data=STRING, url=STRING
)
CONTENT_BLOCK = struct(
    "anthropic.ContentBlock",
    type=STRING,
    text=pointer(STRING),
    citations=slice_of(
        struct(
            "anthropic.Citation",
            type=STRING,
            url=STRING,
            title=STRING,
            encrypted_index=STRING,
            cited_text=STRING,
        )
    ),
    source=pointer(IMAGE_SOURCE),
    id=STRING,
    name=STRING,
    input=TOOL_CALL.fields["function"].fields["arguments"],
    tool_use_id=STRING,
    content=ANY,
    is_error=BOOL,
    thinking=pointer(STRING),
    signature=STRING,
)
_BLOCKS = slice_of(CONTENT_BLOCK)
_PARAM_AUX = struct("anthropic.MessageParam raw", role=STRING, content=RAW)


def _param_accepts(value: object) -> bool:
    """MessageParam.UnmarshalJSON (anthropic.go:91): content is required (an empty
    RawMessage fails both decodes), a string or null, else []ContentBlock."""
    if type(value) is not tuple or not _fits(value, _PARAM_AUX):
        return False
    found, content = last_member(value, _PARAM_AUX, "content")
    if not found:
        return False
    return content is None or type(content) is str or _fits(content, _BLOCKS)


def _param_decoder(value: object, held: object) -> object:
    """Role is always replaced; a string content replaces the blocks, an array is decoded
    into the blocks the element already had (json.Unmarshal into &m.Content)."""
    held = held if type(held) is dict else {}
    _found, role = last_member(value, _PARAM_AUX, "role")
    _found, content = last_member(value, _PARAM_AUX, "content")
    if content is None or type(content) is str:
        blocks: object = GoSlice([{"type": "text", "text": content or ""}])
    else:
        blocks = decode(content, _BLOCKS, held.get("content"))
    return {"role": role if type(role) is str else "", "content": blocks}


MESSAGE_PARAM = GoType(
    GoKind.CUSTOM, "anthropic.MessageParam", accepts=_param_accepts, decoder=_param_decoder
)
ANTHROPIC_TOOL = struct(
    "anthropic.Tool", type=STRING, name=STRING, description=STRING, max_uses=INT
)
ANTHROPIC_TOOL.field("input_schema", RAW)
ANTHROPIC = struct(
    "anthropic.MessagesRequest",
    model=STRING,
    max_tokens=INT,
    messages=slice_of(MESSAGE_PARAM),
    system=ANY,
    stream=BOOL,
    temperature=pointer(FLOAT64),
    top_p=pointer(FLOAT64),
    top_k=INT_PTR,
    stop_sequences=slice_of(STRING),
    tools=slice_of(ANTHROPIC_TOOL),
    tool_choice=pointer(
        struct("anthropic.ToolChoice", type=STRING, name=STRING, disable_parallel_tool_use=BOOL)
    ),
    thinking=pointer(struct("anthropic.ThinkingConfig", type=STRING, budget_tokens=INT)),
    metadata=pointer(struct("anthropic.Metadata", user_id=STRING)),
    output_config=pointer(struct("anthropic.OutputConfig", effort=STRING)),
)
