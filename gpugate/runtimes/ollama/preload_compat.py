"""The pre-load refusals of /v1/responses and /v1/messages (Ollama v0.24.0).

Each middleware binds its own request type, converts it to an api.ChatRequest and answers
400 when the conversion fails, before the chat handler runs (middleware/openai.go:509,
middleware/anthropic.go:813). Fields are read as Go holds them after every duplicate
member (`govalues`).
"""

from __future__ import annotations

from gpugate.runtimes.ollama.gojson import Bound, GoJsonError
from gpugate.runtimes.ollama.gotypes import check, is_base64
from gpugate.runtimes.ollama.govalues import as_pairs, decode, decode_bound, field_name
from gpugate.runtimes.ollama.preload import arguments_refused, image_refused
from gpugate.runtimes.ollama.requests import TOOL
from gpugate.runtimes.ollama.requests_compat import (
    ANTHROPIC,
    ITEM_CONTENT,
    ITEM_TYPES,
    RESPONSES,
    content_kind,
    item_type,
    last_member,
)

TOOL_PARAMETERS = TOOL.fields["function"].fields["parameters"]
_EFFORTS = frozenset({"none", "low", "medium", "high", "max"})


def _contents_refused(contents: object) -> bool:
    """convertResponsesContent (responses.go:658): a file is refused, an image with a URL
    must decode (decodeImageURL)."""
    for item in contents if type(contents) is list else ():
        kind = content_kind(item)
        if kind is None or kind.name == "openai.ResponsesFileContent":
            return True
        if kind.name == "openai.ResponsesImageContent":
            url = decode(item, kind).get("image_url", "")
            if url and image_refused(url):
                return True
    return False


def _item_refused(item: object) -> bool:
    """FromResponsesRequest (responses.go:386) for one input item."""
    kind = item_type(item)
    if kind is None:
        return True
    concrete = ITEM_TYPES[kind]
    content = ITEM_CONTENT.get(kind)
    if content is not None:
        return _contents_refused(last_member(item, concrete, content)[1])
    if kind == "function_call":
        arguments = decode(item, concrete).get("arguments", "")
        return arguments != "" and arguments_refused(arguments)
    return False


def _parameters_refused(parameters: object) -> bool:
    """convertTool: json.Marshal of the map, then json.Unmarshal into
    api.ToolFunctionParameters."""
    if parameters is None:
        return False
    try:
        check(as_pairs(parameters), TOOL_PARAMETERS)
    except GoJsonError:
        return True
    return False


def responses_refused(bound: Bound) -> bool:
    """ResponsesMiddleware: FromResponsesRequest's errors."""
    items = None
    for key, value in bound.pairs:
        # ResponsesInput.UnmarshalJSON sets Items from an array and leaves it otherwise.
        if type(value) is list and field_name(RESPONSES, key) == "input":
            items = value
    if any(_item_refused(item) for item in items or ()):
        return True
    reasoning = decode_bound(bound, RESPONSES, "reasoning") or {}
    effort = reasoning.get("effort", "")
    if effort and effort not in _EFFORTS:
        return True
    tools = decode_bound(bound, RESPONSES, "tools") or ()
    return any(_parameters_refused(tool.get("parameters")) for tool in tools if tool)


def _source_refused(kind: object, data: object) -> bool:
    """resolveImageSource (anthropic.go:985)."""
    return kind != "base64" or not is_base64(data if type(data) is str else "")


def _tool_result_refused(content: object) -> bool:
    """convertToolResultContent (anthropic.go:998): images inside must resolve."""
    for block in content if type(content) is list else ():
        if type(block) is not dict or block.get("type") != "image":
            continue
        source = block.get("source")
        if type(source) is not dict:
            return True
        kind = source.get("type")
        if _source_refused(kind if type(kind) is str else "", source.get("data")):
            return True
    return False


def _block_refused(block: object) -> bool:
    """convertMessage (anthropic.go:416) for one content block."""
    block = block if type(block) is dict else {}
    kind = block.get("type", "")
    if kind == "image":
        source = block.get("source")
        return source is None or _source_refused(source.get("type", ""), source.get("data", ""))
    if kind == "tool_use":
        return not block.get("id") or not block.get("name")
    if kind == "tool_result":
        return _tool_result_refused(block.get("content"))
    return False


def _schema_refused(tool: dict) -> bool:
    """convertTool (anthropic.go:611): a custom tool's input_schema must unmarshal into
    api.ToolFunctionParameters."""
    schema = tool.get("input_schema")
    if str(tool.get("type", "")).startswith("web_search") or schema is None:
        return False
    try:
        check(schema, TOOL_PARAMETERS)
    except GoJsonError:
        return True
    return False


def messages_refused(bound: Bound) -> bool:
    """AnthropicMessagesMiddleware: model, max_tokens and messages required, then
    FromMessagesRequest's errors."""
    if not bound.get("model") or bound.get("max_tokens", 0) <= 0:
        return True
    messages = decode_bound(bound, ANTHROPIC, "messages")
    if not messages:
        return True
    for message in messages:
        blocks = message.get("content") if type(message) is dict else None
        if any(_block_refused(block) for block in blocks or ()):
            return True
    tools = [tool or {} for tool in decode_bound(bound, ANTHROPIC, "tools") or ()]
    builtin = any(str(tool.get("type", "")).startswith("web_search") for tool in tools)
    for tool in tools:
        kind = str(tool.get("type", ""))
        if builtin and not kind.startswith("web_search") and tool.get("name") == "web_search":
            continue  # a custom tool shadowed by the built-in one is dropped unread
        if _schema_refused(tool):
            return True
    return False
