"""whisper-server's HTTP, the real build and the simulator alike: routes, error texts and
headers as cpp-httplib and server.cpp write them, keep-alive, and requests it refuses."""

from __future__ import annotations

import json

import pytest

from gpugate_sim.whisper.page import default_content
from gpugate_sim.whisper.transcript import wav_bytes
from tests.whisper.conftest import Models, StartServer, WhisperServer
from tests.whisper.wire import Connection, exchange, form, form_type, model_form, part, request

DEFAULT_HEADERS = {
    "Server": "whisper.cpp",
    "Access-Control-Allow-Origin": "*",
    "Access-Control-Allow-Headers": "content-type, authorization",
}


@pytest.fixture(scope="module")
def server(module_starter: StartServer, models: Models) -> WhisperServer:
    return module_starter(["-m", str(models.english)])


def inference(server: WhisperServer, *parts: bytes) -> tuple[int, str | None, bytes]:
    answer = exchange(
        server.port, request("POST", "/inference", form(*parts), content_type=form_type())
    )
    return answer.status, answer.header("Content-Type"), answer.body


def audio(seconds: float = 3.0) -> bytes:
    return part("file", wav_bytes(seconds), disposition=b'form-data; name="file"; filename="a.wav"')


def test_every_answer_carries_the_default_headers_and_keep_alive(server):
    for raw in (
        request("GET", "/health"),
        request("GET", "/nowhere"),
        request("OPTIONS", "/inference"),
    ):
        answer = exchange(server.port, raw)
        for name, value in DEFAULT_HEADERS.items():
            assert answer.header(name) == value, (raw, name)
        assert answer.header("Keep-Alive") == "timeout=5, max=100"


def test_health_page_and_preflight(server):
    health = exchange(server.port, request("GET", "/health"))
    assert (health.status, health.header("Content-Type"), health.body) == (
        200, "application/json", b'{"status":"ok"}',
    )  # fmt: skip
    head = exchange(server.port, request("HEAD", "/health"), head_only=True)
    assert (head.status, head.header("Content-Length"), head.header("Accept-Ranges")) == (
        200, "15", "bytes",
    )  # fmt: skip
    page = exchange(server.port, request("GET", "/"))
    assert (page.status, page.header("Content-Type")) == (200, "text/html")
    assert page.body == default_content(server.port, "/inference").encode()
    preflight = exchange(server.port, request("OPTIONS", "/inference"))
    assert (preflight.status, preflight.body, preflight.header("Content-Type")) == (200, b"", None)


@pytest.mark.parametrize(
    ("method", "path", "message"),
    [
        ("GET", "/nowhere", b"/nowhere"),
        ("POST", "/health", b"/health"),
        ("GET", "/load", b"/load"),
        ("GET", "/lo%61d", b"/load"),
        ("PUT", "/inference", b"/inference"),
        ("DELETE", "/load", b"/load"),
        ("GET", "/health/", b"/health/"),
    ],
)
def test_what_no_route_takes_is_404_naming_the_decoded_path(server, method, path, message):
    answer = exchange(server.port, request(method, path))
    assert (answer.status, answer.header("Content-Type"), answer.body) == (
        404, "text/plain", b"File Not Found (" + message + b")",
    )  # fmt: skip


@pytest.mark.parametrize("path", ["/%6Coad", "/lo%61d", "/%u006coad", "/load?x=1", "/load#frag"])
def test_the_load_route_is_matched_on_the_decoded_path(server, models, path):
    before = len(server.loads())
    raw = request("POST", path, model_form(str(models.english)), content_type=form_type())
    assert exchange(server.port, raw).said == (200, b"Load was successful!")
    assert server.loads()[before:] == [str(models.english)]


@pytest.mark.parametrize(
    "raw",
    [
        b"GET /health HTTP/1.2\r\nHost: x\r\n\r\n",
        b"GET /health\r\nHost: x\r\n\r\n",
        b"FOO /health HTTP/1.1\r\nHost: x\r\n\r\n",
        b"GET /health HTTP/1.1\r\nBad Header\r\n\r\n",
        b"GET /health HTTP/1.1\r\nX: a\x01b\r\n\r\n",
    ],
)
def test_a_request_it_cannot_parse_is_400_invalid_request(server, raw):
    answer = exchange(server.port, raw)
    assert (answer.status, answer.header("Content-Type"), answer.body) == (
        400, "text/plain", b"Invalid request",
    )  # fmt: skip
    assert answer.header("Server") == "whisper.cpp"


def test_connection_close_and_http_1_0_end_the_connection(server):
    with Connection(server.port) as conn:
        answer = conn.exchange(request("GET", "/health", headers=[b"Connection: close"]))
        assert (answer.status, answer.header("Connection")) == (200, "close")
        assert conn.closed()
    with Connection(server.port) as conn:
        answer = conn.exchange(b"GET /health HTTP/1.0\r\n\r\n")
        # It says keep-alive, then closes: the head is written before the version counts.
        assert (answer.status, answer.header("Keep-Alive")) == (200, "timeout=5, max=100")
        assert conn.closed()
    with Connection(server.port) as conn:
        answer = conn.exchange(b"GET /health HTTP/1.0\r\nConnection: Keep-Alive\r\n\r\n")
        assert answer.status == 200
        assert (
            conn.exchange(b"GET /health HTTP/1.0\r\nConnection: Keep-Alive\r\n\r\n").status == 200
        )


def test_the_100th_request_on_a_connection_is_its_last(server):
    with Connection(server.port) as conn:
        for _ in range(99):
            assert conn.exchange(request("GET", "/health")).header("Keep-Alive")
        last = conn.exchange(request("GET", "/health"))
        assert (last.status, last.header("Connection"), last.header("Keep-Alive")) == (
            200, "close", None,
        )  # fmt: skip
        assert conn.closed()


def test_an_idle_connection_is_closed_by_the_server(server):
    with Connection(server.port) as conn:
        assert conn.exchange(request("GET", "/health")).status == 200
        assert conn.closed(), "cpp-httplib's keep-alive wait ends (5 s)"


def test_a_transcription_in_each_format(server):
    status, content_type, body = inference(server, audio())
    assert (status, content_type) == (200, "application/json")
    assert list(json.loads(body)) == ["text"]
    status, content_type, _ = inference(server, audio(), part("response_format", "text"))
    assert (status, content_type) == (200, "text/html; charset=utf-8")
    status, content_type, body = inference(server, audio(), part("response_format", "srt"))
    assert (status, content_type) == (200, "application/x-subrip")
    status, content_type, body = inference(server, audio(), part("response_format", "vtt"))
    assert (status, content_type) == (200, "text/vtt") and body.startswith(b"WEBVTT\n\n")
    status, content_type, body = inference(server, audio(), part("response_format", "verbose_json"))
    document = json.loads(body)
    assert list(document) == [
        "task", "language", "duration", "text", "segments",
        "detected_language", "detected_language_probability", "language_probabilities",
    ]  # fmt: skip
    assert (document["task"], document["language"], document["duration"]) == (
        "transcribe", "english", 3.0,
    )  # fmt: skip
    for segment in document["segments"]:
        assert list(segment)[:5] == ["id", "text", "start", "end", "tokens"]


def test_the_first_of_a_repeated_field_counts_and_model_is_ignored(server, models):
    status, content_type, _ = inference(
        server, audio(), part("response_format", "srt"), part("response_format", "json"),
        part("model", str(models.missing)),
    )  # fmt: skip
    assert (status, content_type) == (200, "application/x-subrip")


@pytest.mark.parametrize(
    ("fields", "said"),
    [
        ((part("response_format", "json"),), (400, b"Invalid request")),
        ((part("file", b"not audio"),), (400, b"Invalid request")),
        ((audio(), part("temperature", "warm")), (500, b"500 Internal Server Error\nstof")),
        ((audio(), part("offset_t", "soon")), (500, b"500 Internal Server Error\nstoi")),
        ((audio(), part("beam_size", "99999999999")), (500, b"500 Internal Server Error\nstoi")),
    ],
)
def test_inference_errors(server, fields, said):
    status, content_type, body = inference(server, *fields)
    assert ((status, body), content_type) == (said, "text/plain")
