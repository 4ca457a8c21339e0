"""The simulated whisper-server against what whisper.cpp v1.9.3's server does.

Each test pins one behaviour of the real server (examples/server/server.cpp, the
cpp-httplib 0.20 it vendors, src/whisper.cpp, examples/common-whisper.cpp).
"""

from __future__ import annotations

import json
import os
import pty
import select
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpugate.core.units import MiB
from gpugate_sim.device import SimulatedGpuHost
from gpugate_sim.serverprocess import child_env, listens
from gpugate_sim.whisper import SimWhisper
from gpugate_sim.whisper.audio import (
    AudioError,
    float_wav_bytes,
    mp3_bytes,
    read_audio,
    wav_bytes,
)
from gpugate_sim.whisper.page import default_content
from gpugate_sim.whisper.process import whisper_argv
from gpugate_sim.whisper.server import LISTENING
from tests.ports import free_ports
from tests.sim.test_sim_whisper import TURBO, TURBO_BYTES, card, spec, wait_for
from tests.sim.test_sim_whisper_http import Connection, multipart
from tests.whisper.ggml_models import write_multilingual

WAIT = 20.0
BASE_EN = "ggml-base.en.bin"


@pytest.fixture
def gpu(tmp_path: Path) -> SimulatedGpuHost:
    return card(tmp_path)


@pytest.fixture
def server(gpu: SimulatedGpuHost) -> Iterator[SimWhisper]:
    with SimWhisper(spec(), gpu.directory) as sim:
        yield sim


def verbose(conn: Connection, **fields: bytes | str) -> dict:
    status, _, body = conn.request(
        "POST", "/inference", multipart({"response_format": "verbose_json", **fields})
    )
    assert status == 200, body
    return json.loads(body)


def logged(sim: SimWhisper, text: str) -> bool:
    """Whether a stderr line (read by another thread) contains `text`."""
    return any(text in line for line in sim.stderr_lines)


# -- the process ---------------------------------------------------------------------------


def test_a_second_instance_binds_the_same_port(gpu: SimulatedGpuHost) -> None:
    # cpp-httplib's default_socket_options set SO_REUSEPORT: the second bind succeeds.
    (port,) = free_ports(1)
    with (
        SimWhisper(spec(port), gpu.directory) as first,
        SimWhisper(spec(port), gpu.directory) as second,
    ):
        assert first.pid != second.pid
        assert listens(first.pid, port) and listens(second.pid, port)
        assert (first.returncode, second.returncode) == (None, None)
        assert first.url == second.url == f"http://127.0.0.1:{port}"


def test_the_listening_line_reaches_a_pipe_only_at_exit(server: SimWhisper) -> None:
    conn = Connection(server.url or "")
    assert conn.request("GET", "/health")[0] == 200
    # A line on stderr (unbuffered) after the bind: stdout had its chance to arrive first.
    assert conn.request("POST", "/inference", multipart({"response_format": "json"}))[0] == 400
    wait_for(lambda: "error: no 'file' field in the request" in server.stderr_lines, "stderr")
    assert not [line for line in server.stdout_lines if line.startswith(LISTENING)]
    assert server.stop() == 0
    assert f"{LISTENING} {server.url}" in server.stdout_lines
    assert "Caught signal 15, shutting down gracefully..." in server.stdout_lines


def test_the_listening_line_shows_at_once_on_a_terminal(gpu: SimulatedGpuHost) -> None:
    (port,) = free_ports(1)
    master, slave = pty.openpty()
    process = subprocess.Popen(
        whisper_argv(spec(port), gpu.directory),
        stdin=subprocess.DEVNULL,
        stdout=slave,
        stderr=subprocess.DEVNULL,
        env=child_env(),
    )
    os.close(slave)
    seen = b""
    try:
        deadline = time.monotonic() + WAIT
        while LISTENING.encode() not in seen:
            assert time.monotonic() < deadline, f"no listening line on the terminal: {seen!r}"
            ready, _, _ = select.select([master], [], [], deadline - time.monotonic())
            if ready:
                seen += os.read(master, 4096)
        assert process.poll() is None, "printed while it runs (line-buffered on a terminal)"
    finally:
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=WAIT) == 0
        os.close(master)


def test_stdio_to_a_pipe_nobody_reads_kills_with_sigpipe() -> None:
    read, write = os.pipe()
    os.close(read)
    code = (
        "from gpugate_sim.whisper import stdio\n"
        "out, err = stdio.install()\n"
        "err.write('error: no reader\\n')\n"
        "raise SystemExit(0)\n"
    )
    try:
        process = subprocess.Popen([sys.executable, "-c", code], stderr=write, env=child_env())
    finally:
        os.close(write)
    assert process.wait(timeout=WAIT) == -signal.SIGPIPE


# -- GET / ---------------------------------------------------------------------------------


def test_the_built_in_page_is_server_cpps() -> None:
    page = default_content(8080, "/inference")
    assert len(page.encode()) == 2130
    assert page.startswith("\n    <html>\n    <head>\n") and page.endswith("</html>\n    ")
    assert "<style>" in page and "font-family: sans-serif;" in page
    assert '-F no_speech_thold="0.6" \\\n' in page
    assert '<input type="number" id="temperature" name="temperature" value="0.0"' in page
    assert "curl 127.0.0.1:8080/inference \\\n" in page and "curl 127.0.0.1:8080/load \\\n" in page
    assert (
        len(default_content(12345, "/v1/audio/transcriptions").encode()) == 2130 + 2 * 1 + 3 * 14
    ), "the port twice, the path three times"


def test_get_and_head_of_the_page(server: SimWhisper) -> None:
    conn = Connection(server.url or "")
    port = int((server.url or "").rsplit(":", 1)[1])
    status, headers, body = conn.request("GET", "/")
    assert (status, headers["Content-Type"]) == (200, "text/html")
    assert body == default_content(port, "/inference").encode()
    assert "Accept-Ranges" not in headers
    conn.send("HEAD", "/")
    while b"\r\n\r\n" not in conn.buffer:
        conn.buffer += conn.sock.recv(65536)
    head, conn.buffer = conn.buffer.split(b"\r\n\r\n", 1)
    lines = head.decode().split("\r\n")
    fields = dict(line.split(": ", 1) for line in lines[1:])
    assert lines[0].split()[1] == "200"
    assert fields["Accept-Ranges"] == "bytes"
    assert int(fields["Content-Length"]) == len(body)
    # No body followed the HEAD: the next answer on the connection parses from its start.
    assert conn.request("GET", "/health")[:1] == (200,)


# -- /inference ----------------------------------------------------------------------------


def test_verbose_json_as_the_handler_builds_it(server: SimWhisper) -> None:
    doc = verbose(Connection(server.url or ""), file=wav_bytes(3.0), temperature="0.2")
    (segment,) = doc["segments"]
    assert list(segment) == ["id", "text", "start", "end", "tokens", "words", "temperature",
                             "avg_logprob", "no_speech_prob"]  # fmt: skip
    assert all(list(word) == ["word", "start", "end", "t_dtw", "probability"]
               for word in segment["words"])  # fmt: skip
    assert {word["t_dtw"] for word in segment["words"]} == {-1}
    # C floats widened to double, as nlohmann prints them.
    assert segment["temperature"] == 0.20000000298023224
    probabilities = doc["language_probabilities"]
    assert len(probabilities) > 5 and min(probabilities.values()) > 0.001
    assert list(probabilities)[:3] == ["en", "zh", "de"], "in whisper's language-id order"
    assert doc["detected_language"] == "english"
    assert (
        doc["detected_language_probability"] == probabilities["en"] == max(probabilities.values())
    )
    assert "language_probabilities" not in verbose(
        Connection(server.url or ""), file=wav_bytes(1.0), no_language_probabilities="true"
    )


def test_detect_language_only_detects(server: SimWhisper) -> None:
    conn = Connection(server.url or "")
    body = multipart({"file": wav_bytes(6.0), "detect_language": "true", "language": "de"})
    assert conn.request("POST", "/inference", body)[2] == b'{"text":""}'
    doc = verbose(conn, file=wav_bytes(6.0), detect_language="true")
    assert (doc["text"], doc["segments"], doc["language"]) == ("", [], "english")
    assert doc["duration"] == 6.0
    wait_for(lambda: logged(server, "auto-detected language: en (p = 0.937500)"), "detection")


def test_an_english_only_model_ignores_language_and_translate(server: SimWhisper) -> None:
    conn = Connection(server.url or "")
    doc = verbose(conn, file=wav_bytes(1.0), language="de", translate="true")
    assert (doc["task"], doc["language"]) == ("translate", "german"), "multilingual: as asked"
    assert conn.request("POST", "/load", multipart({"model": f"models/{BASE_EN}"}))[0] == 200
    doc = verbose(conn, file=wav_bytes(1.0), language="de", translate="true")
    assert (doc["task"], doc["language"]) == ("transcribe", "english")
    warning = (
        "operator(): WARNING: model is not multilingual, ignoring language and translation options"
    )
    wait_for(lambda: warning in server.stderr_lines, "the warning")


@pytest.mark.parametrize(
    ("audio", "seconds"),
    [(mp3_bytes(2.0), 2.0), (float_wav_bytes(2.0, rate=44100, channels=2), 2.0)],
    ids=["mp3", "float-wav"],
)
def test_mp3_and_float_wav_are_decoded(server: SimWhisper, audio: bytes, seconds: float) -> None:
    doc = verbose(Connection(server.url or ""), file=audio)
    assert abs(doc["duration"] - seconds) < 0.05
    assert doc["text"] == " and so my fellow\n"


def test_a_wav_without_frames_is_a_400_and_50_ms_is_no_text(server: SimWhisper) -> None:
    conn = Connection(server.url or "")
    status, headers, body = conn.request("POST", "/inference", multipart({"file": wav_bytes(0)}))
    # server.cpp's {"error":"failed to read audio data"}, replaced by its error handler.
    assert (status, headers["Content-Type"], body) == (400, "text/plain", b"Invalid request")
    frames = "error: failed to read the frames of the audio data (Invalid argument)"
    wait_for(lambda: "error: failed to read audio data" in server.stderr_lines, "the error")
    index = server.stderr_lines.index("error: failed to read audio data")
    assert server.stderr_lines[index - 1] == frames
    status, _, body = conn.request("POST", "/inference", multipart({"file": wav_bytes(0.05)}))
    assert (status, body) == (200, b'{"text":""}')
    wait_for(lambda: logged(server, "input is too short - 50 ms < 100 ms"), "the warning")


def test_audio_lengths_from_headers() -> None:
    assert read_audio(mp3_bytes(1.0)).frames == 39 * 1152
    assert read_audio(float_wav_bytes(0.5, rate=8000)).samples_16k == 8000
    streaminfo = (44100 << 44) | (1 << 41) | (15 << 36) | 88200  # rate, channels-1, bits-1, n
    flac = b"fLaC" + bytes((0x80, 0, 0, 34)) + bytes(10) + streaminfo.to_bytes(8, "big")
    flac += bytes(16)
    audio = read_audio(flac)
    assert (audio.rate, audio.channels, audio.seconds) == (44100, 2, 2.0)
    for data in (b"not audio", b"RIFF\0\0\0\0WAVE", wav_bytes(0)):
        with pytest.raises(AudioError):
            read_audio(data)


# -- /load ---------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["file", "directory"])
def test_a_load_of_something_that_is_no_model_exits_1_without_an_answer(
    gpu: SimulatedGpuHost, tmp_path: Path, kind: str
) -> None:
    target = tmp_path / "not-a-model"
    if kind == "file":
        target.write_bytes(b"just some bytes, no ggml magic")
    else:
        target.mkdir()
    with SimWhisper(spec(), gpu.directory) as sim:
        assert gpu.read().held_by(sim.pid, 0) == TURBO_BYTES
        conn = Connection(sim.url or "")
        conn.send("POST", "/load", multipart({"model": str(target)}))
        assert conn.closed_by_server(), "no answer"
        assert sim.wait(timeout=WAIT) == 1
    assert "whisper_model_load: invalid model data (bad magic)" in sim.stderr_lines
    assert sim.stderr_lines[-1] == "error: model init  failed, no model loaded must exit"
    assert gpu.read().processes == [], "its memory went with it"
    assert gpu.ooms() == []


def test_a_real_model_file_loads(gpu: SimulatedGpuHost, tmp_path: Path) -> None:
    model = write_multilingual(tmp_path / "ggml-tiny.bin", pad_to=3 * MiB)
    with SimWhisper(spec(), gpu.directory) as sim:
        conn = Connection(sim.url or "")
        assert conn.request("POST", "/load", multipart({"model": str(model)}))[0] == 200
        assert gpu.read().held_by(sim.pid, 0) == model.stat().st_size
        assert TURBO in sim.spec.models
