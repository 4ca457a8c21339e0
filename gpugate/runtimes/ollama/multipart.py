"""/v1/audio/transcriptions read as Go's net/http reads it (middleware/openai.go:726).

ParseMultipartForm needs a multipart/form-data Content-Type with a boundary; FormValue
("model") is the first value in r.Form, where the URL query's values come before the
body's; FormFile("file") must be present and the file not empty.
"""

from __future__ import annotations

import email.message
import re
from urllib.parse import parse_qs

import attrs

_HEADER_END = re.compile(rb"\r?\n\r?\n")


@attrs.frozen
class Transcription:
    """What the middleware reads before it hands the request to the chat handler."""

    model: str
    has_file: bool


def _params(header: str) -> tuple[str, dict[str, str]]:
    message = email.message.Message()
    message["content-type"] = header
    params = {k.lower(): v for k, v in message.get_params(header="content-type")[1:]}
    return message.get_content_type(), params


def read_transcription(body: bytes, content_type: str, query: str) -> Transcription | None:
    """None where the middleware answers 400 (no form, no model, no file, an empty file)."""
    media, params = _params(content_type)
    boundary = params.get("boundary")
    if media != "multipart/form-data" or not boundary:
        return None
    delimiter = b"--" + boundary.encode("latin-1")
    chunks = body.split(delimiter)
    if len(chunks) < 3:
        return None
    values: list[str] = []
    file_size: int | None = None
    for chunk in chunks[1:]:
        if chunk.startswith(b"--"):
            break
        chunk = chunk[2:] if chunk.startswith(b"\r\n") else chunk.lstrip(b"\n")
        split = _HEADER_END.search(chunk)
        if split is None:
            return None
        headers = chunk[: split.start()].decode("latin-1")
        content = chunk[split.end() :]
        content = content[:-2] if content.endswith(b"\r\n") else content.removesuffix(b"\n")
        disposition = ""
        for line in re.split(r"\r?\n", headers):
            name, _, value = line.partition(":")
            if name.strip().lower() == "content-disposition":
                disposition = value.strip()
        _, dparams = _params(disposition.replace("form-data", "x/form-data", 1))
        field = dparams.get("name")
        if field is None:
            continue
        if dparams.get("filename"):
            if field == "file" and file_size is None:
                file_size = len(content)
        elif field == "model":
            values.append(content.decode("utf-8", "replace"))
    query_values = parse_qs(query, keep_blank_values=True).get("model", [])
    model = (query_values + values or [""])[0]
    if not model or not file_size:
        return None
    return Transcription(model, True)
