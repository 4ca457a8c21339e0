"""The simulated whisper-server's HTTP contract: routes, bodies, httplib framing, /load."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpugate.core.units import GiB, MiB
from gpugate_sim.device import SimulatedGpuHost
from gpugate_sim.whisper import SimWhisper
from gpugate_sim.whisper.transcript import wav_bytes
from tests.sim.test_sim_whisper import TURBO, TURBO_BYTES, card, spec, wait_for

BOUNDARY = "----simwhisper"
CORS = {
    "Server": "whisper.cpp",
    "Access-Control-Allow-Origin": "*",
    "Access-Control-Allow-Headers": "content-type, authorization",
}


def multipart(fields: dict[str, bytes | str], filename: str = "a.wav") -> bytes:
    out = b""
    for name, value in fields.items():
        data = value.encode() if isinstance(value, str) else value
        disposition = f'form-data; name="{name}"'
        if name == "file":
            disposition += f'; filename="{filename}"'
        out += f"--{BOUNDARY}\r\nContent-Disposition: {disposition}\r\n\r\n".encode()
        out += data + b"\r\n"
    return out + f"--{BOUNDARY}--\r\n".encode()


class Connection:
    """One raw keep-alive HTTP/1.1 connection, to see exactly what the server frames."""

    def __init__(self, url: str) -> None:
        host, port = url.removeprefix("http://").split(":")
        self.sock = socket.create_connection((host, int(port)), timeout=20)
        self.buffer = b""

    def send(self, method: str, path: str, body: bytes = b"", multi: bool = True) -> None:
        head = f"{method} {path} HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n"
        if body and multi:
            head += f"Content-Type: multipart/form-data; boundary={BOUNDARY}\r\n"
        self.sock.sendall(head.encode() + b"\r\n" + body)

    def response(self) -> tuple[int, dict[str, str], bytes]:
        while b"\r\n\r\n" not in self.buffer:
            chunk = self.sock.recv(65536)
            assert chunk, "connection closed before a response"
            self.buffer += chunk
        head, self.buffer = self.buffer.split(b"\r\n\r\n", 1)
        lines = head.decode().split("\r\n")
        headers = dict(line.split(": ", 1) for line in lines[1:])
        length = int(headers["Content-Length"])
        while len(self.buffer) < length:
            self.buffer += self.sock.recv(65536)
        body, self.buffer = self.buffer[:length], self.buffer[length:]
        return int(lines[0].split()[1]), headers, body

    def request(self, method: str, path: str, body: bytes = b"") -> tuple[int, dict, bytes]:
        self.send(method, path, body)
        return self.response()

    def closed_by_server(self) -> bool:
        return self.sock.recv(1) == b""


@pytest.fixture
def gpu(tmp_path: Path) -> SimulatedGpuHost:
    return card(tmp_path)


@pytest.fixture
def server(gpu: SimulatedGpuHost) -> Iterator[SimWhisper]:
    with SimWhisper(spec(keepalive_timeout=1.0), gpu.directory) as sim:
        yield sim


def test_health_index_options_and_unknown_paths(server: SimWhisper) -> None:
    conn = Connection(server.url or "")
    status, headers, body = conn.request("GET", "/health")
    assert (status, headers["Content-Type"], body) == (200, "application/json", b'{"status":"ok"}')
    assert headers["Keep-Alive"] == "timeout=1, max=100"
    assert CORS.items() <= headers.items()
    status, headers, body = conn.request("GET", "/")
    assert (status, headers["Content-Type"]) == (200, "text/html")
    assert b"<h1>Whisper.cpp Server</h1>" in body and b'action="/inference"' in body
    status, headers, body = conn.request("OPTIONS", "/inference")
    assert (status, body, headers["Access-Control-Allow-Origin"]) == (200, b"", "*")
    for method, path in (("GET", "/v1/models"), ("GET", "/inference"), ("POST", "/health")):
        status, headers, body = conn.request(method, path)
        assert (status, headers["Content-Type"]) == (404, "text/plain")
        assert body == f"File Not Found ({path})".encode()
        assert CORS.items() <= headers.items()


@pytest.mark.parametrize(
    ("fmt", "content_type", "expected"),
    [
        ("json", "application/json", '{"text":" and so my fellow\\n"}'),
        ("text", "text/html; charset=utf-8", " and so my fellow\n"),
        ("srt", "application/x-subrip",
         "1\n00:00:00,000 --> 00:00:02,000\n and so my fellow\n\n"),
        ("vtt", "text/vtt", "WEBVTT\n\n00:00:00.000 --> 00:00:02.000\n and so my fellow\n\n"),
    ],
)  # fmt: skip
def test_inference_formats(server: SimWhisper, fmt: str, content_type: str, expected: str) -> None:
    conn = Connection(server.url or "")
    body = multipart({"file": wav_bytes(2.0), "response_format": fmt, "model": "ignored"})
    status, headers, answer = conn.request("POST", "/inference", body)
    assert (status, headers["Content-Type"], answer.decode()) == (200, content_type, expected)


def test_inference_verbose_json_and_length_follows_duration(server: SimWhisper) -> None:
    conn = Connection(server.url or "")
    body = multipart({"file": wav_bytes(12.0, rate=44100, channels=2), "temperature": "0.5",
                      "response_format": "verbose_json"})  # fmt: skip
    status, _, answer = conn.request("POST", "/inference", body)
    doc = json.loads(answer)
    assert status == 200
    assert list(doc) == ["task", "language", "duration", "text", "segments", "detected_language",
                         "detected_language_probability", "language_probabilities"]  # fmt: skip
    assert (doc["task"], doc["language"], doc["duration"]) == ("transcribe", "english", 12.0)
    assert [(s["start"], s["end"]) for s in doc["segments"]] == [(0, 5), (5, 10), (10, 12)]
    first = doc["segments"][0]
    assert list(first) == ["id", "text", "start", "end", "tokens", "words", "temperature",
                           "avg_logprob", "no_speech_prob"]  # fmt: skip
    assert first["temperature"] == 0.5 and len(first["words"]) == 10
    short = json.loads(conn.request("POST", "/inference", multipart({"file": wav_bytes(1)}))[2])
    assert len(short["text"]) < len(doc["text"])


def test_inference_errors(server: SimWhisper) -> None:
    conn = Connection(server.url or "")
    # server.cpp sets JSON bodies for its 400s; httplib's error handler replaces them.
    for body in (multipart({"response_format": "json"}), multipart({"file": b"not audio"})):
        status, headers, answer = conn.request("POST", "/inference", body)
        assert (status, headers["Content-Type"], answer) == (400, "text/plain", b"Invalid request")
    status, headers, answer = conn.request(
        "POST", "/inference", multipart({"file": wav_bytes(1), "temperature": "warm"})
    )
    assert (status, headers["Content-Type"]) == (500, "text/plain")
    assert answer == b"500 Internal Server Error\nstof"
    status, _, answer = conn.request(
        "POST", "/inference", multipart({"file": wav_bytes(1), "best_of": "2.9x"})
    )
    assert status == 200, "std::stoi takes the numeric prefix"
    # stderr is read by another thread: the answers may come first.
    for line in ("error: no 'file' field in the request", "error: failed to read audio data"):
        wait_for(lambda line=line: line in server.stderr_lines, line)


def test_load_swaps_the_model_in_vram(server: SimWhisper, gpu: SimulatedGpuHost) -> None:
    conn = Connection(server.url or "")
    status, headers, body = conn.request(
        "POST", "/load", multipart({"model": "m/ggml-base.en.bin"})
    )
    assert (status, headers["Content-Type"], body) == (
        200,
        "application/text",
        b"Load was successful!",
    )
    assert gpu.read().held_by(server.pid, 0) == 200 * MiB
    assert conn.request("GET", "/health")[0] == 200


def test_a_failed_load_leaves_health_stuck_until_a_good_one(
    server: SimWhisper, gpu: SimulatedGpuHost
) -> None:
    conn = Connection(server.url or "")
    # A form without any part is no form to cpp-httplib (400 before the handler runs, the
    # state untouched); one without a `model` part reaches the handler.
    status, _, body = conn.request("POST", "/load", multipart({}))
    assert (status, body) == (400, b"Invalid request")
    assert conn.request("GET", "/health")[0] == 200
    for fields in ({"other": "x"}, {"model": "models/missing.bin"}):
        status, headers, body = conn.request("POST", "/load", multipart(fields))  # type: ignore[arg-type]
        assert (status, headers["Content-Type"], body) == (400, "text/plain", b"Invalid request")
        # /health answers 503 "loading model"; httplib's error handler makes it a 404.
        status, headers, body = conn.request("GET", "/health")
        assert (status, body) == (404, b"File Not Found (/health)")
    assert gpu.read().held_by(server.pid, 0) == TURBO_BYTES, "the old model stays loaded"
    assert conn.request("POST", "/inference", multipart({"file": wav_bytes(1)}))[0] == 200
    assert conn.request("POST", "/load", multipart({"model": TURBO}))[0] == 200
    assert conn.request("GET", "/health")[:1] == (200,)


def test_a_load_that_does_not_fit_exits_1_after_freeing(tmp_path: Path) -> None:
    gpu = card(tmp_path, total=3 * GiB)
    models = {TURBO: TURBO_BYTES, "huge.bin": 4 * GiB}
    with SimWhisper(spec(models=models), gpu.directory) as sim:
        conn = Connection(sim.url or "")
        conn.send("POST", "/load", multipart({"model": "huge.bin"}))
        assert conn.closed_by_server()
        assert sim.wait(timeout=20) == 1
    assert "error: model init  failed, no model loaded must exit" in sim.stderr_lines
    (oom,) = gpu.ooms()
    assert (oom.pid, oom.requested, oom.free) == (sim.pid, 4 * GiB - 4 * GiB // 8, 3 * GiB)
    assert gpu.read().processes == []


def test_keep_alive_closes_after_100_requests_and_when_idle(server: SimWhisper) -> None:
    conn = Connection(server.url or "")
    for _ in range(99):
        status, headers, _ = conn.request("GET", "/health")
        assert status == 200 and "Connection" not in headers
    status, headers, _ = conn.request("GET", "/health")
    assert headers["Connection"] == "close" and "Keep-Alive" not in headers
    assert conn.closed_by_server()
    idle = Connection(server.url or "")
    assert idle.request("GET", "/health")[0] == 200
    started = time.monotonic()
    assert idle.closed_by_server()
    assert 0.8 <= time.monotonic() - started < 5.0


def test_a_client_that_leaves_during_decoding_frees_the_mutex(gpu: SimulatedGpuHost) -> None:
    with SimWhisper(spec(decode_per_audio_second=0.2), gpu.directory) as sim:
        leaving = Connection(sim.url or "")
        long = multipart({"file": wav_bytes(60.0)}, filename="long.wav")  # 12 s to decode
        leaving.send("POST", "/inference", long)
        # stderr, not stdout: what the server printf()s reaches a pipe only at its exit.
        wait_for(
            lambda: any("processing 'long.wav'" in line for line in sim.stderr_lines), "decoding"
        )
        conn = Connection(sim.url or "")
        conn.send("POST", "/inference", multipart({"file": wav_bytes(0.5)}))
        leaving.sock.close()
        started = time.monotonic()
        status, _, _ = conn.response()
        assert status == 200 and time.monotonic() - started < 6.0
        wait_for(lambda: "client disconnected, aborted processing" in sim.stderr_lines, "the log")


@pytest.mark.parametrize("coding", ["gzip", "deflate", "br", "zstd", "gzip, br"])
def test_an_encoded_body_is_refused_as_httplib_without_compression_refuses_it(
    server: SimWhisper, gpu: SimulatedGpuHost, coding: str
) -> None:
    # 415 from cpp-httplib, which whisper-server's error handler turns into its 404; the
    # handler never runs, so no model is loaded.
    conn = Connection(server.url or "")
    body = multipart({"model": "m/ggml-base.en.bin"})
    head = (
        f"POST /load HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n"
        f"Content-Type: multipart/form-data; boundary={BOUNDARY}\r\n"
        f"Content-Encoding: {coding}\r\n\r\n"
    )
    conn.sock.sendall(head.encode() + body)
    status, _, answer = conn.response()
    assert (status, answer) == (404, b"File Not Found (/load)")
    assert gpu.read().held_by(server.pid, 0) == TURBO_BYTES, "its model untouched"
