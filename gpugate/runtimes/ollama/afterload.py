"""What Ollama refuses only once a request's model is loaded, told apart from a failed load.

Ollama v0.24.0 answers 500 both when a model fails to load (scheduleRunner's error,
server/routes.go handleScheduleError) and for two refusals it makes after the load, with
the model resident and its runner idle:

* GenerateHandler parses the request's own `template` (unless `raw`) once scheduleRunner
  has returned a runner (server/routes.go GenerateHandler, `template.Parse(req.Template)`):
  text/template's error, `template: :1: unclosed action`, or template.go Identifiers'
  `undefined template specified`;
* llmServer.Completion checks the request's `format` before it asks the runner anything
  (llm/server.go Completion): a format that is not null, `""`, `"json"` or a JSON object is
  `invalid format: %q; expected "json" or a valid JSON Schema object` (%q of the member's
  bytes); an object llama.cpp cannot make a grammar of is `invalid JSON schema in format`.

The adapter reads the request's own `format` and `template` as Ollama does, so it knows
which of these refusals the request can meet (`AfterLoad`), and `refused` matches
Ollama's answer against them: the format's refusal word for word, a template's by
text/template's own prefix. Any other 5xx of a loading request is a failed load.
"""

from __future__ import annotations

import json

import attrs

from gpugate.runtimes.ollama.gojson import Bound, go_string

SCHEMA_REFUSAL = "invalid JSON schema in format"
_NO_FORMAT = ("null", '""', '"json"')


@attrs.frozen
class AfterLoad:
    """The refusals a request can meet once its model is loaded."""

    format_refusal: str | None = None
    """Ollama's refusal of the request's format, when its format is refused."""
    schema: bool = False
    """Its format is a JSON object: llama.cpp may refuse to make a grammar of it."""
    own_template: bool = False
    """GenerateHandler parses the request's own template after the load."""

    def refused(self, status: int, body: bytes) -> bool:
        """Whether Ollama's answer is one of these refusals (the model loaded)."""
        if status != 500:
            return False
        message = error_message(body)
        if message is None:
            return False
        if self.format_refusal is not None and message == self.format_refusal:
            return True
        if self.schema and message == SCHEMA_REFUSAL:
            return True
        return self.own_template and (
            message.startswith("template: ") or message == "undefined template specified"
        )


NONE = AfterLoad()


def go_quote(text: str) -> str:
    """strconv.Quote: printable runes as they are (unicode.IsPrint is Python's
    isprintable), the rest escaped."""
    escapes = {"\a": "\\a", "\b": "\\b", "\f": "\\f", "\n": "\\n", "\r": "\\r", "\t": "\\t"}
    escapes["\v"] = "\\v"
    out = ['"']
    for char in text:
        if char in '"\\':
            out.append("\\" + char)
        elif char.isprintable():
            out.append(char)
        elif char in escapes:
            out.append(escapes[char])
        elif ord(char) < 0x80:
            out.append(f"\\x{ord(char):02x}")
        elif ord(char) < 0x10000:
            out.append(f"\\u{ord(char):04x}")
        else:
            out.append(f"\\U{ord(char):08x}")
    out.append('"')
    return "".join(out)


def after_load(path: str, bound: Bound) -> AfterLoad:
    """What `bound` (a body of `path`) can be refused for once its model is loaded."""
    if path not in ("/api/generate", "/api/chat"):
        return NONE
    members = bound.members("format")
    raw = bound.text[members[-1].value_start : members[-1].end] if members else ""
    raw = go_string(raw)
    format_refusal = None
    if raw and raw not in _NO_FORMAT and not raw.startswith("{"):
        format_refusal = (
            f'invalid format: {go_quote(raw)}; expected "json" or a valid JSON Schema object'
        )
    template = bound.get("template") if path == "/api/generate" else None
    own_template = isinstance(template, str) and bool(template) and bound.get("raw") is not True
    return AfterLoad(format_refusal, raw.startswith("{"), own_template)


def error_message(body: bytes) -> str | None:
    """The error text of Ollama's `{"error": "..."}` (gin's c.JSON of gin.H)."""
    try:
        document = json.loads(body)
    except ValueError:
        return None
    if not isinstance(document, dict):
        return None
    error = document.get("error")
    return error if isinstance(error, str) else None
