"""What each demand route's body needs of its model, and which models refuse it (v0.24.0)."""

from __future__ import annotations

import json

import attrs
import pytest

from gpugate.runtimes.base import RouteKind
from gpugate.runtimes.ollama.adapter import OllamaDemand
from gpugate.runtimes.ollama.needs import (
    Handler,
    ModelFacts,
    Needs,
    refused,
    scan_size,
)
from gpugate.runtimes.ollama.reading import READERS
from tests.runtimes.test_ollama_adapter import READING

GENERATE = Needs(Handler.GENERATE)
CHAT = Needs(Handler.CHAT)
EMBED = Needs(Handler.EMBED)
INSERT = Needs(Handler.GENERATE, ("insert",))
TOOLS = Needs(Handler.CHAT, ("tools",))
GEN_THINK = Needs(Handler.GENERATE, think=True)
CHAT_THINK = Needs(Handler.CHAT, think=True)
TOO_LARGE = Needs(Handler.GENERATE, image_too_large=True)
ANTHROPIC = Needs(Handler.CHAT, relax_thinking=True)
ANTHROPIC_THINK = Needs(Handler.CHAT, think=True, relax_thinking=True)
ANTHROPIC_TOOLS = Needs(Handler.CHAT, ("tools",), relax_thinking=True)

_MSG = b'"messages":[{"role":"user","content":"hi"}]'
_TOOL = b'{"type":"function","function":{"name":"f"}}'
_PNG = b'"image":"data:image/png;base64,iVBORw0KGgo="'


def needs_of(path: str, body: bytes) -> Needs:
    result = READING.classify("POST", path, body, "application/json")
    assert result.kind is RouteKind.DEMAND, body
    assert isinstance(result.reading, OllamaDemand)
    return result.reading.needs


def _table(path: str, rows: list[tuple[bytes, Needs]]):
    return pytest.mark.parametrize(
        "path,body,expected", [(path, body, expected) for body, expected in rows]
    )


@_table(
    "/api/generate",
    [
        (b'{"model":"m","prompt":"x"}', GENERATE),
        (b'{"model":"m","prompt":"x","suffix":""}', GENERATE),
        (b'{"model":"m","prompt":"x","suffix":"y"}', INSERT),
        (b'{"model":"m","prompt":"x","SUFFIX":"y"}', INSERT),
        (b'{"model":"m","prompt":"x","suffix":"y","suffix":""}', GENERATE),
        (b'{"model":"m","prompt":"x","think":true}', GEN_THINK),
        (b'{"model":"m","prompt":"x","think":"low"}', GEN_THINK),
        (b'{"model":"m","prompt":"x","think":"max"}', GEN_THINK),
        (b'{"model":"m","prompt":"x","think":false}', GENERATE),
        (b'{"model":"m","prompt":"x","think":true,"think":null}', GENERATE),
        (b'{"model":"m","prompt":"x","width":4096,"height":4096}', GENERATE),
        (b'{"model":"m","prompt":"x","width":4097}', TOO_LARGE),
        (b'{"model":"m","prompt":"x","height":5000}', TOO_LARGE),
        # null leaves a non-pointer field as the member before it set it
        (b'{"model":"m","prompt":"x","width":5000,"width":null}', TOO_LARGE),
        (b'{"model":"m","prompt":"x","width":-5000}', GENERATE),
        (
            b'{"model":"m","prompt":"x","suffix":"y","think":"high","width":9999}',
            Needs(Handler.GENERATE, ("insert",), think=True, image_too_large=True),
        ),
    ],
)
def test_generate(path, body, expected):
    assert needs_of(path, body) == expected


@_table(
    "/api/chat",
    [
        (b'{"model":"m",' + _MSG + b"}", CHAT),
        (b'{"model":"m"}', CHAT),
        (b'{"model":"m",' + _MSG + b',"tools":[' + _TOOL + b"]}", TOOLS),
        (b'{"model":"m",' + _MSG + b',"tools":[]}', CHAT),
        (b'{"model":"m",' + _MSG + b',"tools":[' + _TOOL + b'],"tools":null}', CHAT),
        (b'{"model":"m",' + _MSG + b',"tools":[' + _TOOL + b'],"Tools":[]}', CHAT),
        (b'{"model":"m",' + _MSG + b',"think":"medium"}', CHAT_THINK),
        (b'{"model":"m",' + _MSG + b',"think":false}', CHAT),
        # ChatRequest has no suffix, width or height: the fields are skipped
        (b'{"model":"m",' + _MSG + b',"suffix":"y","width":9999}', CHAT),
        (
            b'{"model":"m",' + _MSG + b',"tools":[' + _TOOL + b'],"think":true}',
            Needs(Handler.CHAT, ("tools",), think=True),
        ),
    ],
)
def test_chat(path, body, expected):
    assert needs_of(path, body) == expected


@pytest.mark.parametrize(
    "path,body",
    [
        ("/api/embed", b'{"model":"m","input":"x"}'),
        ("/api/embed", b'{"model":"m","input":"x","think":true,"tools":[1]}'),
        ("/api/embeddings", b'{"model":"m","prompt":"x","think":true}'),
        ("/v1/embeddings", b'{"model":"m","input":"x"}'),
        ("/v1/embeddings", b'{"model":"m","input":["x"],"reasoning_effort":"high"}'),
    ],
)
def test_embedding_routes_need_nothing(path, body):
    needs = needs_of(path, body)
    # EmbeddingsHandler alone looks the model up by its name as written (routes.go:893).
    written = "m:latest" if path == "/api/embeddings" else None
    assert needs == attrs.evolve(EMBED, exact_name=written)


@pytest.mark.parametrize(
    ("model", "written"),
    [("M", "M:latest"), (" bge-M3 ", "bge-M3:latest"), ("library/x:Q4", "x:Q4")],
)
def test_embeddings_keep_the_name_as_written(model, written):
    body = json.dumps({"model": model, "prompt": "x"}).encode()
    assert needs_of("/api/embeddings", body).exact_name == written


_CC = b'{"model":"m",' + _MSG


@_table(
    "/v1/chat/completions",
    [
        (_CC + b"}", CHAT),
        (_CC + b',"tools":[' + _TOOL + b"]}", TOOLS),
        (_CC + b',"tools":[]}', CHAT),
        (_CC + b',"reasoning_effort":"high"}', CHAT_THINK),
        (_CC + b',"reasoning_effort":"max"}', CHAT_THINK),
        (_CC + b',"reasoning_effort":"none"}', CHAT),
        (_CC + b',"reasoning_effort":""}', CHAT),
        (_CC + b',"reasoning":{"effort":"low"}}', CHAT_THINK),
        # a reasoning object decides even without an effort in it
        (_CC + b',"reasoning":{},"reasoning_effort":"high"}', CHAT),
        (_CC + b',"reasoning":null,"reasoning_effort":"medium"}', CHAT_THINK),
        # a second object is decoded into the struct the first left
        (_CC + b',"reasoning":{"effort":"high"},"reasoning":{}}', CHAT_THINK),
        (_CC + b',"reasoning":{"effort":"none"},"reasoning_effort":"high"}', CHAT),
        # ChatCompletionRequest has no think field
        (_CC + b',"think":true}', CHAT),
    ],
)
def test_chat_completions(path, body, expected):
    assert needs_of(path, body) == expected


@_table(
    "/v1/completions",
    [
        (b'{"model":"m","prompt":"x"}', GENERATE),
        (b'{"model":"m","prompt":"x","suffix":"y"}', INSERT),
        (b'{"model":"m","prompt":"x","suffix":""}', GENERATE),
        # CompletionRequest has no think, width or height
        (b'{"model":"m","prompt":"x","think":true,"width":9999}', GENERATE),
    ],
)
def test_completions(path, body, expected):
    assert needs_of(path, body) == expected


def _image_rows(size: str, expected: Needs) -> list[tuple[str, bytes, Needs]]:
    field = b',"size":"' + size.encode("unicode_escape") + b'"'
    return [
        ("/v1/images/generations", b'{"model":"m","prompt":"p"' + field + b"}", expected),
        ("/v1/images/edits", b'{"model":"m","prompt":"p",' + _PNG + field + b"}", expected),
    ]


@pytest.mark.parametrize(
    "path,body,expected",
    [
        ("/v1/images/generations", b'{"model":"m","prompt":"p"}', GENERATE),
        ("/v1/images/edits", b'{"model":"m","prompt":"p",' + _PNG + b"}", GENERATE),
        *_image_rows("1024x1024", GENERATE),
        *_image_rows("4096x4096", GENERATE),
        *_image_rows("4097x1", TOO_LARGE),
        *_image_rows("1x8192", TOO_LARGE),
        *_image_rows("5000X5000", GENERATE),
        *_image_rows("5000x99999999999", GENERATE),
    ],
)
def test_images(path, body, expected):
    assert needs_of(path, body) == expected


@pytest.mark.parametrize(
    "text,scanned",
    [
        ("1024x768", (1024, 768)),
        ("  5000x 7", (5000, 7)),
        ("\r5000x7", (5000, 7)),
        ("\u30005000x7", (5000, 7)),
        ("+5000x-1", (5000, -1)),
        ("007x008", (7, 8)),
        ("5000x1junk", (5000, 1)),
        ("0x10", (0, 10)),
        ("2147483647x1", (2147483647, 1)),
        ("-2147483648x1", (-2147483648, 1)),
        ("2147483648x1", None),
        ("1x99999999999999999999", None),
        ("5000 x7", None),
        ("5000X7", None),
        ("5000x", None),
        ("5000", None),
        ("x5000", None),
        ("\n5000x1", None),
        ("5000x\n1", None),
        ("5000x\r\n1", None),
        ("+x1", None),
        ("1_000x1", None),
        ("\uff15000x1", None),
        ("", None),
    ],
)
def test_size_is_scanned_as_go_scans_it(text, scanned):
    assert scan_size(text) == scanned


_RS = b'{"model":"m","input":"hi"'
_RS_TOOL = b'{"type":"function","name":"f"}'


@_table(
    "/v1/responses",
    [
        (_RS + b"}", CHAT),
        (_RS + b',"tools":[' + _RS_TOOL + b"]}", TOOLS),
        (_RS + b',"tools":[{"type":"web_search"}]}', TOOLS),
        (_RS + b',"tools":[]}', CHAT),
        (_RS + b',"reasoning":{"effort":"high"}}', CHAT_THINK),
        (_RS + b',"reasoning":{"effort":"none"}}', CHAT),
        (_RS + b',"reasoning":{"summary":"auto"}}', CHAT),
        (_RS + b',"reasoning":{"effort":"low"},"reasoning":{"summary":"auto"}}', CHAT_THINK),
        (_RS + b',"reasoning":{"effort":"low"},"reasoning":null}', CHAT_THINK),
        (_RS + b',"reasoning_effort":"high","think":true}', CHAT),
    ],
)
def test_responses(path, body, expected):
    assert needs_of(path, body) == expected


_AN = b'{"model":"m","max_tokens":8,' + _MSG
_AN_TOOL = b'{"name":"f","input_schema":{"type":"object"}}'
_WEB = b'{"type":"web_search_20250305","name":"web_search"}'


@_table(
    "/v1/messages",
    [
        (_AN + b"}", ANTHROPIC),
        (_AN + b',"tools":[' + _AN_TOOL + b"]}", ANTHROPIC_TOOLS),
        (_AN + b',"tools":[' + _WEB + b"]}", ANTHROPIC_TOOLS),
        (_AN + b',"tools":[' + _WEB + b',{"name":"web_search"}]}', ANTHROPIC_TOOLS),
        (_AN + b',"tools":[]}', ANTHROPIC),
        (_AN + b',"thinking":{"type":"enabled","budget_tokens":1024}}', ANTHROPIC_THINK),
        (_AN + b',"thinking":{"type":"disabled"}}', ANTHROPIC),
        (_AN + b',"thinking":{"type":"disabled"},"output_config":{"effort":"high"}}', ANTHROPIC),
        (
            _AN + b',"thinking":{"type":"adaptive"},"output_config":{"effort":"low"}}',
            ANTHROPIC_THINK,
        ),
        (_AN + b',"output_config":{"effort":"max"}}', ANTHROPIC_THINK),
        (_AN + b',"output_config":{"effort":" XHigh\\n"}}', ANTHROPIC_THINK),
        (_AN + b',"output_config":{"effort":"H\\u0130GH"}}', ANTHROPIC_THINK),
        (_AN + b',"output_config":{"effort":"none"}}', ANTHROPIC),
        (_AN + b',"output_config":{"effort":"ultra"}}', ANTHROPIC),
        (_AN + b',"thinking":{"type":"enabled"},"thinking":{"budget_tokens":1}}', ANTHROPIC_THINK),
        (_AN + b',"thinking":{"type":"enabled"},"thinking":null}', ANTHROPIC),
        (_AN + b',"think":true}', ANTHROPIC),
    ],
)
def test_messages(path, body, expected):
    assert needs_of(path, body) == expected


def test_transcriptions_end_in_chat_with_nothing_more():
    body = (
        b'--B\r\nContent-Disposition: form-data; name="file"; filename="a.wav"\r\n\r\nRIFF\r\n'
        b'--B\r\nContent-Disposition: form-data; name="model"\r\n\r\nm\r\n--B--\r\n'
    )
    result = READING.classify(
        "POST", "/v1/audio/transcriptions", body, "multipart/form-data; boundary=B"
    )
    assert result.kind is RouteKind.DEMAND and result.reading == OllamaDemand(CHAT)


_ANY_BODY = {
    "/api/generate": b'{"model":"m","prompt":"x"}',
    "/api/chat": b'{"model":"m",' + _MSG + b"}",
    "/api/embed": b'{"model":"m","input":"x"}',
    "/api/embeddings": b'{"model":"m","prompt":"x"}',
    "/v1/chat/completions": _CC + b"}",
    "/v1/completions": b'{"model":"m","prompt":"x"}',
    "/v1/embeddings": b'{"model":"m","input":"x"}',
    "/v1/responses": _RS + b"}",
    "/v1/messages": _AN + b"}",
    "/v1/images/generations": b'{"model":"m","prompt":"p"}',
    "/v1/images/edits": b'{"model":"m","prompt":"p",' + _PNG + b"}",
}


def test_every_demand_route_is_covered():
    assert set(_ANY_BODY) == set(READERS)


@pytest.mark.parametrize("path", sorted(_ANY_BODY))
def test_every_demand_carries_its_needs(path):
    assert isinstance(needs_of(path, _ANY_BODY[path]), Needs)


def test_unload_and_pass_carry_none():
    unload = READING.classify("POST", "/api/generate", b'{"model":"m","keep_alive":0}', "")
    refusal = READING.classify("POST", "/api/generate", b'{"model":"m","think":"x"}', "")
    assert unload.kind is RouteKind.UNLOAD and unload.reading is None
    assert refusal.kind is RouteKind.PASS and refusal.reading is None


# -- which models refuse what -------------------------------------------------------------

TEXT = ModelFacts(frozenset({"completion"}))
FULL = ModelFacts(frozenset({"completion", "tools", "insert", "thinking", "vision"}))
EMBEDDER = ModelFacts(frozenset({"embedding"}))
IMAGE_MODEL = ModelFacts(frozenset({"image"}))


@pytest.mark.parametrize(
    "needs,facts,expected",
    [
        (GENERATE, TEXT, False),
        (CHAT, TEXT, False),
        (GENERATE, EMBEDDER, True),
        (CHAT, EMBEDDER, True),
        (EMBED, EMBEDDER, False),
        (EMBED, TEXT, False),
        (INSERT, TEXT, True),
        (INSERT, FULL, False),
        (TOOLS, TEXT, True),
        (TOOLS, FULL, False),
        (GEN_THINK, TEXT, True),
        (CHAT_THINK, TEXT, True),
        (CHAT_THINK, FULL, False),
        (ANTHROPIC_THINK, TEXT, False),
        (ANTHROPIC_TOOLS, TEXT, True),
        # an image model is scheduled for `image` alone, with only its size checked
        (GENERATE, IMAGE_MODEL, False),
        (Needs(Handler.GENERATE, ("insert",), think=True), IMAGE_MODEL, False),
        (TOO_LARGE, IMAGE_MODEL, True),
        (TOO_LARGE, TEXT, False),
        (CHAT, IMAGE_MODEL, True),
        (EMBED, IMAGE_MODEL, False),
        (CHAT, ModelFacts(frozenset({"completion"}), remote=True), True),
        (EMBED, ModelFacts(frozenset({"embedding"}), retired=True), True),
        (GENERATE, ModelFacts(frozenset({"completion", "vision"}), retired=True), True),
    ],
)
def test_refused(needs, facts, expected):
    assert refused(needs, facts) is expected


@pytest.mark.parametrize(
    "path,body,refused_by_text_model",
    [
        ("/v1/chat/completions", _CC + b',"reasoning_effort":"high"}', True),
        ("/v1/chat/completions", _CC + b',"reasoning_effort":"none"}', False),
        ("/v1/responses", _RS + b',"reasoning":{"effort":"medium"}}', True),
        ("/v1/messages", _AN + b',"thinking":{"type":"enabled"}}', False),
        ("/v1/messages", _AN + b',"tools":[' + _AN_TOOL + b"]}", True),
        ("/v1/completions", b'{"model":"m","prompt":"x","suffix":"y"}', True),
        ("/api/generate", b'{"model":"m","prompt":"x","think":"low"}', True),
        ("/api/chat", b'{"model":"m",' + _MSG + b',"tools":[' + _TOOL + b"]}", True),
        ("/v1/images/generations", b'{"model":"m","prompt":"p","size":"8000x8000"}', False),
    ],
)
def test_a_text_only_model_as_each_route_reaches_it(path, body, refused_by_text_model):
    needs = needs_of(path, body)
    assert refused(needs, TEXT) is refused_by_text_model
    assert refused(needs, FULL) is False
