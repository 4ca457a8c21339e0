"""What Ollama's /v1 middlewares refuse before the handler runs, for the simulated Ollama.

FromChatRequest (openai/openai.go:477) turns each message into api.Messages and fails on
content it cannot convert; the transcription middleware (middleware/openai.go:726) reads
the multipart form as net/http's FormValue does: the URL query's value first.
"""

from __future__ import annotations

import base64
import binascii
import json
from email.parser import BytesParser
from email.policy import HTTP
from urllib.parse import parse_qs

from gpugate.sim.ollama.binding import BindError

_EFFORTS = ("high", "medium", "low", "max", "none")
_IMAGE_PREFIXES = tuple(f"data:image/{t};base64," for t in ("jpeg", "jpg", "png", "webp"))


def _go_type(value: object) -> str:
    """fmt's %T of a decoded interface{}."""
    if value is None:
        return "<nil>"
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int | float):
        return "float64"
    return "map[string]interface {}" if isinstance(value, dict) else type(value).__name__


def _b64(text: str) -> bool:
    try:
        base64.b64decode(text.replace("\r", "").replace("\n", ""), validate=True)
    except (binascii.Error, ValueError):
        return False
    return True


def _image(url: str) -> None:
    """decodeImageURL (openai.go:675)."""
    if url.startswith(("http://", "https://")):
        raise BindError(
            "image URLs are not currently supported, please use base64 encoded data instead"
        )
    prefix = "data:;base64," if url.startswith("data:;base64,") else None
    prefix = prefix or next((p for p in _IMAGE_PREFIXES if url.startswith(p)), None)
    if prefix is None or not _b64(url[len(prefix) :]):
        raise BindError("invalid image input")


def _calls(calls: object) -> None:
    """FromCompletionToolCall: each arguments string must be one JSON object (or null)."""
    for call in calls if isinstance(calls, list) else ():
        function = call.get("function") if isinstance(call, dict) else None
        arguments = function.get("arguments") if isinstance(function, dict) else None
        try:
            parsed = json.loads(arguments if isinstance(arguments, str) else "")
        except ValueError:
            raise BindError("invalid tool call arguments") from None
        if parsed is not None and not isinstance(parsed, dict):
            raise BindError("invalid tool call arguments")


def _part(part: object) -> str:
    if not isinstance(part, dict):
        raise BindError("invalid message format")
    kind = part.get("type")
    if kind == "text":
        if not isinstance(part.get("text"), str):
            raise BindError("invalid message format")
        return part["text"]
    if kind == "image_url":
        image = part.get("image_url")
        url = image.get("url") if isinstance(image, dict) else image
        if not isinstance(url, str):
            raise BindError("invalid message format")
        _image(url)
        return ""
    if kind == "input_audio":
        audio = part.get("input_audio")
        if not isinstance(audio, dict):
            raise BindError("invalid input_audio format")
        if not isinstance(audio.get("data"), str):
            raise BindError("invalid input_audio format: missing data")
        if not _b64(audio["data"]):
            raise BindError("invalid input_audio base64 data: illegal base64 data at input byte 0")
        return ""
    raise BindError("invalid message format")


def _effort(body: dict[str, object]) -> object:
    reasoning = body.get("reasoning")
    if isinstance(reasoning, dict):
        return reasoning.get("effort")
    return body.get("reasoning_effort")


def asks_to_think(body: dict[str, object]) -> bool:
    """FromChatRequest's think: a reasoning effort other than "none" asks for it, which
    ChatHandler refuses for a model without `thinking` (routes.go, "does not support
    thinking")."""
    effort = _effort(body)
    return isinstance(effort, str) and effort not in ("", "none")


def completion_stop(body: dict[str, object]) -> None:
    """FromCompleteRequest (openai.go): each element of a `stop` array must be a string."""
    stop = body.get("stop")
    for item in stop if isinstance(stop, list) else ():
        if not isinstance(item, str):
            raise BindError(f"invalid type for 'stop' field: {_go_type(item)}")


def chat_prompt(body: dict[str, object]) -> str:
    """The prompt of a /v1/chat/completions body; BindError with FromChatRequest's words."""
    lines: list[str] = []
    produced = 0
    for message in body.get("messages") or []:
        message = message if isinstance(message, dict) else {}
        content, calls = message.get("content"), message.get("tool_calls")
        role = message.get("role", "")
        if isinstance(content, str):
            _calls(calls)
            lines.append(f"{role}: {content}")
            produced += 1
        elif isinstance(content, list):
            lines.append(f"{role}: " + "".join(_part(part) for part in content))
            produced += len(content)
            if produced and calls:
                _calls(calls)
        else:
            if calls is None:
                raise BindError(f"invalid message content type: {_go_type(content)}")
            _calls(calls)
            produced += 1
    effort = _effort(body)
    if isinstance(effort, str) and effort and effort not in _EFFORTS:
        raise BindError(
            f"invalid reasoning value: '{effort}' "
            '(must be "high", "medium", "low", "max", or "none")'
        )
    return "\n".join(lines)


def form_model(body: bytes, content_type: str, query: str) -> tuple[str, int] | str:
    """(model, audio bytes) from a transcription form, or the middleware's 400 message."""
    media = content_type.split(";")[0].strip().lower()
    if media != "multipart/form-data" or "boundary=" not in content_type:
        return "failed to parse multipart form: request Content-Type isn't multipart/form-data"
    message = BytesParser(policy=HTTP).parsebytes(
        b"Content-Type: " + content_type.encode("latin-1") + b"\r\n\r\n" + body
    )
    values: list[str] = []
    audio: int | None = None
    for part in message.iter_parts():
        name = part.get_param("name", header="content-disposition")
        filename = part.get_param("filename", header="content-disposition")
        payload = part.get_payload(decode=True) or b""
        if filename:
            if name == "file" and audio is None:
                audio = len(payload)
        elif name == "model":
            values.append(payload.decode("utf-8", "replace"))
    # FormValue: r.Form holds the query's values before the body's
    model = (parse_qs(query, keep_blank_values=True).get("model", []) + values or [""])[0]
    if not model:
        return "model is required"
    if audio is None:
        return "file is required: http: no such file"
    if audio == 0:
        return "audio file is empty"
    return model, audio
