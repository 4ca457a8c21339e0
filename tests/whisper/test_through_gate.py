"""The real whisper-server behind the gate, started by it on demand: a transcription, a /load
of each size under a lease for the model it loads, a /load the gate cannot read as the
server would (refused), and a body the server stops reading that carries a /load
(cpp-httplib reads the rest as the next request on a kept connection). tests/whisper/
gated.py says how the CPU build shows on the simulated card.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import aiohttp
import pytest

from gpugate.runtimes.keepalive import HTTPLIB
from gpugate.runtimes.whisper.adapter import WhisperReading
from gpugate_sim.whisper.transcript import wav_bytes
from tests.whisper.conftest import Models
from tests.whisper.gated import START, Gated, gate_before
from tests.whisper.wire import form, form_type, model_form, part, request


@pytest.fixture
async def gated(
    whisper_server_binary, models: Models, tmp_path, sim_host, fakenvml_path
) -> AsyncIterator[Gated]:
    async with gate_before(
        whisper_server_binary, models, tmp_path, sim_host, fakenvml_path
    ) as gated:
        yield gated


async def raw_exchange(port: int, raw: bytes) -> tuple[int, dict[str, str], bytes]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(raw)
        await writer.drain()
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), START)
        lines = head.decode("latin-1").split("\r\n")
        headers = dict(line.split(": ", 1) for line in lines[1:] if line)
        body = await reader.readexactly(int(headers.get("Content-Length", "0")))
        return int(lines[0].split()[1]), headers, body
    finally:
        writer.close()


async def transcribe(url: str) -> tuple[int, str]:
    data = aiohttp.FormData()
    data.add_field("file", wav_bytes(2), filename="a.wav", content_type="audio/wav")
    timeout = aiohttp.ClientTimeout(total=START * 2)
    async with (
        aiohttp.ClientSession(timeout=timeout) as session,
        session.post(url + "/inference", data=data) as resp,
    ):
        return resp.status, await resp.text()


async def test_a_transcription_starts_it_and_is_answered(gated, models):
    status, text = await transcribe(gated.url)
    assert status == 200, text
    assert list(json.loads(text)) == ["text"]
    assert gated.loads() == [str(models.english)], "started once, with its own model"
    assert set(gated.granted()) == {str(models.english)}, "under a start lease"


@pytest.mark.parametrize("pad", [0, 70_000, 3_000_000])
async def test_a_load_of_each_size_is_leased_for_the_model_it_loads(gated, models, pad):
    assert (await transcribe(gated.url))[0] == 200
    body = form(part("pad", b"p" * pad), part("model", str(models.english_other)))
    status, headers, said = await raw_exchange(
        gated.port, request("POST", "/load", body, content_type=form_type())
    )
    assert (status, said) == (200, b"Load was successful!")
    assert headers.get("X-GPUGate-Lease")
    assert gated.loads() == [str(models.english), str(models.english_other)]
    assert set(gated.granted()) == {str(models.english), str(models.english_other)}


async def test_a_load_the_gate_cannot_read_as_the_server_would_is_refused(gated, models):
    assert (await transcribe(gated.url))[0] == 200
    # Of two `model` parts the server loads the second when a read splits the first
    # delimiter: the gate does not guess.
    body = form(part("model", str(models.english_other)), part("model", str(models.multilingual)))
    status, headers, said = await raw_exchange(
        gated.port, request("POST", "/load", body, content_type=form_type())
    )
    assert (status, said, headers["Access-Control-Allow-Origin"]) == (400, b"Invalid request", "*")
    assert gated.loads() == [str(models.english)]


def smuggling(upstream: int, path: str, close: bool) -> bytes:
    """An /inference the server refuses unread (gzip: 415), whose body holds a /load where
    the server's next read of the connection starts: at the body's start when the gate's
    head went up alone (the gate relays a body it does not read as it comes), and 4 KiB
    into what the gate sent when head and body went up together (its head:
    proxy/forward.py `request_head`)."""
    smuggled = request("POST", "/load", model_form(path), content_type=form_type())
    sent = [b"Content-Encoding: gzip", b"Content-Type: " + form_type()]

    def up_head(length: int) -> int:
        lines = [b"POST /inference HTTP/1.1", b"Host: 127.0.0.1:%d" % upstream, *sent]
        lines += [b"X-Forwarded-For: 127.0.0.1", b"Content-Length: %d" % length]
        lines += [b"Connection: close"] if close else []
        return sum(len(line) + 2 for line in lines) + 2

    pad = 4096 - up_head(4096 + 2 * len(smuggled)) - len(smuggled)
    body = smuggled + b"p" * pad + smuggled
    assert up_head(len(body)) + len(smuggled) + pad == 4096
    return request("POST", "/inference", body, headers=sent[:1], content_type=form_type())


@pytest.mark.parametrize("policy", ["kept", "gate"])
async def test_a_load_inside_a_body_the_server_stops_reading_never_runs(
    whisper_server_binary, models, tmp_path, sim_host, fakenvml_path, policy, monkeypatch
):
    if policy == "kept":
        # As the gate was: connections kept, no `Connection: close`. The server reads the
        # rest of the refused body as a request of its own: the /load, under no lease.
        monkeypatch.setattr(WhisperReading, "keep_alive", HTTPLIB)
    async with gate_before(
        whisper_server_binary, models, tmp_path, sim_host, fakenvml_path
    ) as gated:
        assert (await transcribe(gated.url))[0] == 200
        raw = smuggling(gated.upstream, str(models.english_other), close=policy == "gate")
        status, _, said = await raw_exchange(gated.port, raw)
        if policy == "gate":
            assert (status, said) == (404, b"File Not Found (/inference)")
        # (kept: the /load's own answer follows the 404 on the upstream connection, and
        # the gate's relay of the first answer may take some of it.)
        # A transcription sent to the server itself waits for its mutex: any /load that
        # was read by then has run. (Through the gate, with kept connections, the /load's
        # own answer would be relayed as the next request's.)
        assert (await transcribe(f"http://127.0.0.1:{gated.upstream}"))[0] == 200
        assert set(gated.granted()) == {str(models.english)}
        if policy == "kept":
            assert gated.loads()[:2] == [str(models.english), str(models.english_other)]
        else:
            assert gated.loads() == [str(models.english)]


async def test_a_load_with_two_content_types_goes_nowhere(gated, models):
    # whisper-server would read the last; the listener refuses the repeat before any reading.
    types = [b"Content-Type: multipart/form-data; boundary=OTHER", b"Content-Type: " + form_type()]
    raw = request("POST", "/load", model_form(str(models.english_other)), headers=types)
    status, _, _ = await raw_exchange(gated.port, raw)
    assert status == 400
    assert gated.loads() == [] and gated.granted() == [], "not started, nothing leased"
