"""/v1/images/generations and /v1/images/edits read as Ollama v0.24.0 reads them:
cloudPassthroughMiddleware, then ImageGenerationsMiddleware / ImageEditsMiddleware, then
GenerateHandler's refusals before it schedules a load."""

from __future__ import annotations

import pytest

from gpugate.runtimes.base import ApiFamily, RouteKind
from gpugate.runtimes.ollama.reading import ZSTD_ROUTES
from tests.runtimes.test_ollama_adapter import READING

GENERATIONS = "/v1/images/generations"
EDITS = "/v1/images/edits"
_PNG = b'"data:image/png;base64,iVBORw0KGgo="'


def kind(path: str, body: bytes):
    return READING.classify("POST", path, body, "application/json")


def generation(rest: bytes = b"") -> bytes:
    return b'{"model":"m","prompt":"a cat"' + rest + b"}"


def edit(rest: bytes = b"", image: bytes = _PNG) -> bytes:
    return b'{"model":"m","prompt":"a cat","image":' + image + rest + b"}"


@pytest.mark.parametrize(
    "body",
    [
        generation(),
        generation(b',"n":2,"size":"1024x768","response_format":"b64_json","seed":42'),
        generation(b',"seed":null'),
        generation(b',"seed":-9223372036854775808'),
        generation(b',"seed":9223372036854775807'),
        generation(b',"n":-1'),
        # Sscanf fails on these, and Width/Height stay 0: nothing is refused
        generation(b',"size":"large"'),
        generation(b',"size":"99999999999x1"'),
        # An image model refuses a side over 4096, any other model loads (routes.go:2763)
        generation(b',"size":"8192x8192"'),
        # Fields the Go struct does not declare are skipped unread, whatever they hold
        generation(b',"quality":{"a":[1.5,"x"]},"style":1,"user":[]'),
        generation(b',"image":1'),
        b'{"MODEL":"m","Prompt":"a cat","N":1}',
        b'{"model":"m","prompt":"","prompt":"a cat"}',
        b'{"model":"m","prompt":"a cat","prompt":null}',
        b'{"model":"m","prompt":" "}',
        b'{"model":" m ","prompt":"a cat"}',
        generation() + b" trailing bytes the decoder never reads",
        # Exact "model" only for the cloud check: a non-cloud one wins the bind here
        b'{"model":"x:cloud","model":"m","prompt":"a cat"}',
    ],
)
def test_generations_load(body):
    result = kind(GENERATIONS, body)
    assert result.kind is RouteKind.DEMAND, body
    assert result.model == "m:latest"
    assert result.api is ApiFamily.OPENAI


@pytest.mark.parametrize(
    "body",
    [
        edit(),
        edit(image=b'"data:;base64,YQ=="'),
        edit(image=b'"data:image/jpeg;base64,YWJj"'),
        edit(image=b'"data:image/jpg;base64,YWJj"'),
        edit(image=b'"data:image/webp;base64,YW\\r\\nJj"'),
        # An empty payload decodes to no bytes, which is not an error
        edit(image=b'"data:image/png;base64,"'),
        edit(b',"size":"512x512","seed":7'),
        edit(b',"size":"9000x9000"'),
        # ImageEditRequest has no n or response_format: any value is skipped
        edit(b',"n":"two","response_format":1'),
        b'{"model":"m","prompt":"a cat","image":"","IMAGE":' + _PNG + b"}",
        b'{"model":"m","prompt":"a cat","image":' + _PNG + b',"image":null}',
    ],
)
def test_edits_load(body):
    result = kind(EDITS, body)
    assert result.kind is RouteKind.DEMAND, body
    assert result.model == "m:latest"


@pytest.mark.parametrize("path", [GENERATIONS, EDITS])
@pytest.mark.parametrize(
    ("name", "ttl"), [("m", 900.0), ("bge-m3", 901.0), ("flux", 0.0), ("whisperish", None)]
)
def test_the_gate_owns_the_idle_time(path, name, ttl):
    body = edit() if path == EDITS else generation()
    result = kind(path, body.replace(b'"m"', b'"' + name.encode() + b'"', 1))
    assert result.kind is RouteKind.DEMAND
    assert result.model == f"{name}:latest"
    assert result.idle_ttl == ttl
    assert not result.sets_ttl and result.body is None and result.options_key == ""


_BOTH_REFUSE = [
    b'{"model":"m"}',
    b'{"model":"m","prompt":""}',
    b'{"model":"m","prompt":null}',
    b'{"model":"m","prompt":"a cat","prompt":""}',
    b'{"model":"m","Prompt":"a cat","prompt":""}',
    b'{"prompt":"a cat","image":' + _PNG + b"}",
    b'{"model":"","prompt":"a cat","image":' + _PNG + b"}",
    b'{"model":null,"prompt":"a cat","image":' + _PNG + b"}",
    # Wrong JSON types in declared fields: the bind fails
    b'{"model":"m","prompt":1,"image":' + _PNG + b"}",
    b'{"model":"m","prompt":["a cat"],"image":' + _PNG + b"}",
    b'{"model":{"name":"m"},"prompt":"a cat","image":' + _PNG + b"}",
    b'{"model":"m","prompt":"a cat","size":1024,"image":' + _PNG + b"}",
    b'{"model":"m","prompt":"a cat","seed":"42","image":' + _PNG + b"}",
    b'{"model":"m","prompt":"a cat","seed":4.2,"image":' + _PNG + b"}",
    b'{"model":"m","prompt":"a cat","seed":1e3,"image":' + _PNG + b"}",
    b'{"model":"m","prompt":"a cat","seed":9223372036854775808,"image":' + _PNG + b"}",
    b'{"model":"m","prompt":"a cat","seed":{"v":1},"image":' + _PNG + b"}",
    # GenerateHandler: a name that does not parse, or a cloud model (proxied, not loaded)
    b'{"model":"m:local:cloud","prompt":"a cat","image":' + _PNG + b"}",
    b'{"model":"x:cloud","prompt":"a cat","image":' + _PNG + b"}",
    b'{"model":"x:7b-cloud","prompt":"a cat","image":' + _PNG + b"}",
    b'{"Model":"x:cloud","prompt":"a cat","image":' + _PNG + b"}",
    b'{"model":"m","model":"x:cloud","prompt":"a cat","image":' + _PNG + b"}",
    # The decoder's own refusals
    b'["model","m"]',
    b"",
    b'{"model":"m","prompt":"a cat",}',
    b'{"model":"m","prompt":"a cat","x":' + b"[" * 10000 + b"]" * 10000 + b"}",
]


@pytest.mark.parametrize("path", [GENERATIONS, EDITS])
@pytest.mark.parametrize("body", _BOTH_REFUSE)
def test_both_refuse_before_loading(path, body):
    assert kind(path, body).kind is RouteKind.PASS


@pytest.mark.parametrize(
    "body",
    [
        generation(b',"n":"2"'),
        generation(b',"n":1.0'),
        generation(b',"n":true'),
        generation(b',"response_format":["b64_json"]'),
        generation(b',"response_format":false'),
    ],
)
def test_generations_refuse_wrong_types(body):
    assert kind(GENERATIONS, body).kind is RouteKind.PASS
    # The edit request declares neither field: the same members are skipped there
    assert kind(EDITS, body[:-1] + b',"image":' + _PNG + b"}").kind is RouteKind.DEMAND


@pytest.mark.parametrize(
    "image",
    [
        None,
        b'""',
        b"null",
        b"1",
        b'["data:image/png;base64,YQ=="]',
        b'{"url":"data:image/png;base64,YQ=="}',
        b'"http://example.com/cat.png"',
        b'"https://example.com/cat.png"',
        b'"iVBORw0KGgo="',
        b'"data:image/gif;base64,R0lGODlh"',
        b'"data:image/PNG;base64,YWJj"',
        b'"data:image/png;base64,YQ"',
        b'"data:image/png;base64,YQ==YQ=="',
        b'"data:image/png;base64,YW Jj"',
        b'"data:image/png;base64,!!!!"',
        b'"data:image/png;base64,YWJj\\u0000"',
        b'"data:image/png,YWJj"',
    ],
)
def test_edits_refuse_a_missing_or_undecodable_image(image):
    body = b'{"model":"m","prompt":"a cat"}' if image is None else edit(image=image)
    assert kind(EDITS, body).kind is RouteKind.PASS
    # Image generation has no image field: the same body loads there
    assert kind(GENERATIONS, body).kind is RouteKind.DEMAND


def test_a_later_image_replaces_a_good_one():
    body = edit(b',"image":"data:image/png;base64,YQ"')
    assert kind(EDITS, body).kind is RouteKind.PASS


def test_a_cloud_looking_name_without_the_tag_loads():
    result = kind(GENERATIONS, b'{"model":"x-cloud","prompt":"a cat"}')
    assert result.kind is RouteKind.DEMAND and result.model == "x-cloud:latest"


def test_both_routes_read_their_bodies():
    for path in (GENERATIONS, EDITS):
        assert READING.wants_body("POST", path)
        assert not READING.wants_body("GET", path)
        assert kind(path, None).kind is RouteKind.PASS
        get = READING.classify("GET", path, generation(), "application/json")
        assert get.kind is RouteKind.PASS


def test_zstd_routes_are_the_cloud_passthrough_routes():
    assert isinstance(ZSTD_ROUTES, frozenset)
    assert set(ZSTD_ROUTES) == {
        "/v1/chat/completions",
        "/v1/completions",
        "/v1/embeddings",
        "/v1/responses",
        "/v1/messages",
        GENERATIONS,
        EDITS,
    }


@pytest.mark.parametrize("path", [GENERATIONS, EDITS])
def test_a_zstd_frame_is_refused_as_on_the_other_v1_routes(path):
    result = kind(path, b"\x28\xb5\x2f\xfd\x00\x58\x00\x00")
    assert result.kind is RouteKind.REFUSE
    assert result.refusal.status == 400
    assert result.refusal.message == "invalid character '(' looking for beginning of value"
