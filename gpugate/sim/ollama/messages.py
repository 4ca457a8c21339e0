"""The fields inside chat messages, checked as Go's decoder checks them, with its wording.

Go names a nested field by the path from the request struct and the innermost struct
type: `json: cannot unmarshal number into Go struct field Message.messages.role of type
string` (openai.Message). api.Message has its own UnmarshalJSON (api/types.go:223): its
error comes back through the outer decoder, which names the request struct instead
(`ChatRequest.messages.role`) and stops decoding there.
"""

from __future__ import annotations

import base64
import binascii
import enum

import attrs

from gpugate.sim.ollama.gofold import go_fold


class Leaf(enum.Enum):
    STRING = "string"
    BOOL = "bool"
    INT = "int"
    FLOAT = "float64"
    ANY = "interface {}"
    RAW = "json.RawMessage"
    IMAGE = "api.ImageData"
    ARGUMENTS = "api.ToolCallFunctionArguments"
    PROPERTIES = "api.ToolPropertiesMap"
    """An ordered map decoded by jsonparser's ObjectEach: an object, or null."""


@attrs.frozen
class Shape:
    """A Go struct as far as its fields' JSON types go."""

    name: str
    """reflect's Name(), which errors put before the field path."""
    go_type: str
    """reflect's String(), which errors name as the type."""
    fields: dict[str, Leaf | Shape | tuple[str, Leaf | Shape]]
    """A field is a leaf, a struct, or ("[]T", element) for a slice."""
    fresh: bool = False
    """Its UnmarshalJSON decodes into a new value (api.Message): nothing merges into it."""
    pointer: bool = False
    """A pointer to it: null sets it to nil (a struct value keeps what it held)."""


_API_CALL = Shape(
    "ToolCall",
    "api.ToolCall",
    {
        "id": Leaf.STRING,
        "function": Shape(
            "ToolCallFunction",
            "api.ToolCallFunction",
            {"index": Leaf.INT, "name": Leaf.STRING, "arguments": Leaf.ARGUMENTS},
        ),
    },
)
API_MESSAGE = Shape(
    "Alias",
    "api.Alias",
    fresh=True,
    fields={
        "role": Leaf.STRING,
        "content": Leaf.STRING,
        "thinking": Leaf.STRING,
        "images": ("[]api.ImageData", Leaf.IMAGE),
        "tool_calls": ("[]api.ToolCall", _API_CALL),
        "tool_name": Leaf.STRING,
        "tool_call_id": Leaf.STRING,
    },
)
OPENAI_MESSAGE = Shape(
    "Message",
    "openai.Message",
    {
        "role": Leaf.STRING,
        "content": Leaf.ANY,
        "reasoning": Leaf.STRING,
        "tool_calls": (
            "[]openai.ToolCall",
            Shape(
                "ToolCall",
                "openai.ToolCall",
                {
                    "id": Leaf.STRING,
                    "index": Leaf.INT,
                    "type": Leaf.STRING,
                    # an anonymous struct: reflect's Name() is ""
                    "function": Shape(
                        "",
                        'struct { Name string "json:\\"name\\""; '
                        'Arguments string "json:\\"arguments\\"" }',
                        {"name": Leaf.STRING, "arguments": Leaf.STRING},
                    ),
                },
            ),
        ),
        "name": Leaf.STRING,
        "tool_call_id": Leaf.STRING,
    },
)


class Found(Exception):
    """A field's error: the message, and whether decoding stops there."""

    def __init__(self, message: str, *, stops: bool) -> None:
        super().__init__(message)
        self.stops = stops


def _kind(value: object) -> str:
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    return "object"


def member_key(shape: Shape, key: str) -> str | None:
    """The field of `shape` a member with this key decodes into (exact, else folded)."""
    if key in shape.fields:
        return key
    folded = go_fold(key)
    for name in shape.fields:
        if go_fold(name) == folded:
            return name
    return None


@attrs.frozen
class TypeMismatch:
    """An UnmarshalTypeError: its parts, so an outer decoder can give it its context."""

    value: str
    struct: str
    path: tuple[str, ...]
    go_type: str

    def text(self) -> str:
        where = ".".join(self.path)
        return (
            f"json: cannot unmarshal {self.value} into Go struct field "
            f"{self.struct}.{where} of type {self.go_type}"
        )


class _Walk:
    """One decode: the first saved error, in document order."""

    def __init__(self, fold: object) -> None:
        self.first: str | TypeMismatch | None = None
        self.pairs_type = fold

    def save(self, error: str | TypeMismatch) -> None:
        if self.first is None:
            self.first = error

    def mismatch(self, value: object, go_type: str, struct: str, path: list[str]) -> None:
        self.save(TypeMismatch(_kind(value), struct, tuple(path), go_type))

    def leaf(self, value: object, leaf: Leaf, struct: str, path: list[str]) -> None:
        if value is None or leaf is Leaf.ANY:
            return
        if leaf is Leaf.STRING and not isinstance(value, str):
            self.mismatch(value, "string", struct, path)
        elif leaf is Leaf.INT and (isinstance(value, bool) or not isinstance(value, int)):
            self.mismatch(value, "int", struct, path)
        elif leaf is Leaf.BOOL and not isinstance(value, bool):
            self.mismatch(value, "bool", struct, path)
        elif leaf is Leaf.FLOAT and (isinstance(value, bool) or not isinstance(value, int | float)):
            self.mismatch(value, "float64", struct, path)
        elif leaf is Leaf.IMAGE:
            if isinstance(value, str):
                try:
                    base64.b64decode(value.replace("\r", "").replace("\n", ""), validate=True)
                except (binascii.Error, ValueError):
                    self.save("illegal base64 data at input byte 0")
            elif not isinstance(value, list):
                self.mismatch(value, "api.ImageData", struct, path)
        elif leaf in (Leaf.ARGUMENTS, Leaf.PROPERTIES) and not isinstance(value, self.pairs_type):
            # orderedmap's UnmarshalJSON (jsonparser.ObjectEach) takes only an object
            self.save("Value is not an object")

    def struct(self, value: object, shape: Shape, struct: str, path: list[str]) -> None:
        if value is None:
            return
        if not isinstance(value, self.pairs_type):
            self.mismatch(value, shape.go_type, struct, path)
            return
        for key, member in value:
            name = member_key(shape, key)
            if name is None:
                continue
            field = shape.fields[name]
            inner = [*path, name]
            owner = shape.name
            if isinstance(field, Leaf):
                self.leaf(member, field, owner, inner)
            elif isinstance(field, Shape):
                self.struct(member, field, owner, inner)
            else:
                go_type, elem = field
                if member is None:
                    continue
                if not isinstance(member, list):
                    self.mismatch(member, go_type, owner, inner)
                    continue
                for item in member:
                    if isinstance(elem, Leaf):
                        self.leaf(item, elem, owner, inner)
                    else:
                        self.struct(item, elem, owner, inner)


def check_messages(value: list, shape: Shape, request: str, pairs_type: type) -> str | None:
    """The first error Go reports for a `messages` array, raising Found when it stops."""
    walk = _Walk(pairs_type)
    for message in value:
        if message is None:
            continue
        if not isinstance(message, pairs_type):
            if shape is API_MESSAGE:
                # Message.UnmarshalJSON's json.Unmarshal into Alias fails on its own
                raise Found(
                    f"json: cannot unmarshal {_kind(message)} into Go struct field "
                    f"{request}.messages of type api.Alias",
                    stops=True,
                )
            walk.mismatch(message, "openai.Message", request, ["messages"])
            continue
        if shape is API_MESSAGE:
            inner = _Walk(pairs_type)
            inner.struct(message, shape, shape.name, [])
            if isinstance(inner.first, TypeMismatch):
                # returned through the outer decoder, which stops and names the request
                # struct and the whole path (decode.go addErrorContext)
                error = inner.first
                outer = attrs.evolve(error, struct=request, path=("messages", *error.path))
                raise Found(outer.text(), stops=True)
            if inner.first is not None:
                walk.save(inner.first)
        else:
            walk.struct(message, shape, shape.name, ["messages"])
    first = walk.first
    return first.text() if isinstance(first, TypeMismatch) else first


API_TOOL = Shape(
    "Tool",
    "api.Tool",
    {
        "type": Leaf.STRING,
        "items": Leaf.ANY,
        "function": Shape(
            "ToolFunction",
            "api.ToolFunction",
            {
                "name": Leaf.STRING,
                "description": Leaf.STRING,
                "parameters": Shape(
                    "ToolFunctionParameters",
                    "api.ToolFunctionParameters",
                    {
                        "type": Leaf.STRING,
                        "$defs": Leaf.ANY,
                        "items": Leaf.ANY,
                        "required": ("[]string", Leaf.STRING),
                        # the values are api.ToolProperty, not checked here
                        "properties": Leaf.PROPERTIES,
                    },
                ),
            },
        ),
    },
)
"""api/types.go Tool, the element of ChatRequest.Tools and of the OpenAI request's tools."""
STREAM_OPTIONS = Shape("StreamOptions", "openai.StreamOptions", {"include_usage": Leaf.BOOL})
REASONING = Shape("Reasoning", "openai.Reasoning", {"effort": Leaf.STRING})
RESPONSE_FORMAT = Shape(
    "ResponseFormat",
    "openai.ResponseFormat",
    {
        "type": Leaf.STRING,
        "json_schema": Shape("JsonSchema", "openai.JsonSchema", {"schema": Leaf.RAW}, pointer=True),
    },
)


def check_fields(
    value: object, shape: Shape, request: str, field: str, pairs_type: type, *, slice_of: str = ""
) -> str | None:
    """The first error Go reports for a request field of a struct type (`slice_of`: the
    slice type it is a slice of), walking every member, as the decoder saves its first."""
    walk = _Walk(pairs_type)
    if not slice_of:
        walk.struct(value, shape, request, [field])
    elif not isinstance(value, list):
        walk.mismatch(value, slice_of, request, [field])
    else:
        for item in value:
            walk.struct(item, shape, request, [field])
    first = walk.first
    return first.text() if isinstance(first, TypeMismatch) else first
