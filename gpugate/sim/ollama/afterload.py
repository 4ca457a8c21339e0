"""What Ollama refuses only once the model is loaded: a request's own template that does not
parse, a format it cannot use. The model stays loaded; the answer is Ollama's 500.

* GenerateHandler, after scheduleRunner returned a runner, parses the request's `template`
  unless `raw` (server/routes.go, `template.Parse(req.Template)`) and answers its error with
  `c.JSON(500, ...)`: `application/json; charset=utf-8`.
* llmServer.Completion (llm/server.go) refuses a `format` that is not null, `""`, `"json"`
  or a JSON object before it asks the runner anything: `invalid format: %q; expected
  "json" or a valid JSON Schema object`, %q of the member's bytes. The handler's goroutine
  sends it down its channel: a non-streamed answer is `c.JSON(500, ...)`; a streamed one
  goes through streamResponse, which sets `Content-Type: application/json` before its
  c.JSON, so gin keeps that one (no charset).

A schema object is taken as valid here (llama.cpp's SchemaToGrammar decides in Ollama).
"""

from __future__ import annotations

import attrs
from aiohttp import web

from gpugate.sim.ollama.gofold import go_quote
from gpugate.sim.ollama.gotemplate import TemplateError, parse
from gpugate.sim.ollama.wire import JSON_PLAIN, JSON_UTF8, json_response

_NO_FORMAT = ("null", '""', '"json"')


@attrs.frozen
class AfterLoad:
    """A refusal Ollama answers after loading the model."""

    message: str
    from_runner: bool
    """Refused by the runner's Completion (through the handler's channel), not the handler."""

    def answer(self, stream: bool) -> web.Response:
        """Ollama's 500, with the content type its path gives it."""
        content_type = JSON_PLAIN if self.from_runner and stream else JSON_UTF8
        return json_response({"error": self.message}, 500, content_type)


def format_refusal(body: dict[str, object]) -> AfterLoad | None:
    """llmServer.Completion's check of the bound `format` (the member's text, or absent)."""
    raw = body.get("format")
    if not isinstance(raw, str) or not raw or raw in _NO_FORMAT or raw.startswith("{"):
        return None
    message = f'invalid format: {go_quote(raw)}; expected "json" or a valid JSON Schema object'
    return AfterLoad(message, from_runner=True)


def generate_refusal(body: dict[str, object], raw: bool) -> AfterLoad | None:
    """GenerateHandler after the load, for a request with a prompt: its template (unless
    raw), then its format. A template that parses is not executed here."""
    template = body.get("template")
    if not raw and isinstance(template, str) and template:
        try:
            parse(template)
        except TemplateError as exc:
            return AfterLoad(str(exc), from_runner=False)
    return format_refusal(body)
