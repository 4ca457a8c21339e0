"""/load as whisper-server runs it, the real build and the simulator alike: the checks that
answer 400 and leave /health saying "loading", the switch, a file that is no model (the
process exits), and /health and /inference while a load is under way."""

from __future__ import annotations

import concurrent.futures
import json

import pytest

from gpugate_sim.whisper.transcript import wav_bytes
from tests.whisper.conftest import Models
from tests.whisper.fifo import feed_held, hold, make_fifo, reading, wait_until
from tests.whisper.wire import (
    Connection,
    exchange,
    form,
    form_type,
    load,
    model_form,
    part,
    request,
)

OK = (200, b"Load was successful!")
INVALID = (400, b"Invalid request")
STUCK = (404, b"File Not Found (/health)")
"""/health's 503 `loading model`, as cpp-httplib's error handler rewrites it."""


def health(port: int) -> tuple[int, bytes]:
    return exchange(port, request("GET", "/health")).said


def transcribe(port: int, **fields: str) -> tuple[int, bytes]:
    audio = part("file", wav_bytes(2), disposition=b'form-data; name="file"; filename="a.wav"')
    others = [part(name, value) for name, value in fields.items()]
    raw = request("POST", "/inference", form(audio, *others), content_type=form_type())
    return exchange(port, raw).said


@pytest.mark.parametrize("body", ["missing", "no-model-field"])
def test_a_refused_load_leaves_health_loading_until_one_succeeds(starter, models, body):
    server = starter(["-m", str(models.english)])
    sent = model_form(str(models.missing)) if body == "missing" else form(part("other", "x"))
    assert load(server.port, sent).said == INVALID
    assert server.loads() == [str(models.english)], "refused before any load"
    assert health(server.port) == STUCK
    assert transcribe(server.port)[0] == 200, "the model it had still runs"
    assert health(server.port) == STUCK
    assert load(server.port, model_form(str(models.english_other))).said == OK
    assert health(server.port) == (200, b'{"status":"ok"}')
    assert server.loads() == [str(models.english), str(models.english_other)]


def test_a_load_switches_the_model(starter, models: Models):
    server = starter(["-m", str(models.english)])
    status, body = transcribe(server.port, language="de", response_format="verbose_json")
    assert (status, json.loads(body)["language"]) == (200, "english"), "English-only"
    assert load(server.port, model_form(str(models.multilingual))).said == OK
    status, body = transcribe(server.port, language="de", response_format="verbose_json")
    assert (status, json.loads(body)["language"]) == (200, "german")
    assert server.loads() == [str(models.english), str(models.multilingual)]


@pytest.mark.parametrize("what", ["not_a_model", "directory", "truncated"])
def test_a_path_that_opens_but_does_not_load_ends_the_process(starter, models, tmp_path, what):
    server = starter(["-m", str(models.english)])
    if what == "truncated":
        path = tmp_path / "truncated.bin"
        path.write_bytes(models.english.read_bytes()[:300_000])
    else:
        path = getattr(models, what)
    with Connection(server.port) as conn:
        conn.send(request("POST", "/load", model_form(str(path)), content_type=form_type()))
        assert conn.closed(), "no answer"
    assert server.wait_exit() == 1
    assert server.loads() == [str(models.english), str(path)]
    assert "error: model init  failed, no model loaded must exit" in server.stderr()


def test_health_while_a_load_runs_and_inference_after_it(starter, models, tmp_path):
    """The handler holds the server's one mutex while it loads: /health (no mutex) answers
    "loading" meanwhile, and an /inference waits for the load to end."""
    server = starter(["-m", str(models.english)])
    pipe = make_fifo(tmp_path / "pipe.bin")
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        loading = pool.submit(load, server.port, model_form(str(pipe)))
        # is_file_exist opens the pipe and waits for a writer: the load is under way.
        wait_until(lambda: health(server.port) == STUCK, "/health to say loading")
        waiting = pool.submit(transcribe, server.port)
        # One writer from here to the model's last byte: is_file_exist's open returns (it
        # closes the pipe unread), and whisper_init's open of it waits for data.
        writer = hold(pipe)
        wait_until(lambda: str(pipe) in server.loads(), "whisper_init to start")
        wait_until(lambda: reading(server.pid, pipe), "whisper_init to open the pipe")
        assert health(server.port) == STUCK
        assert not waiting.done(), waiting.exception() or waiting.result()
        feed_held(writer, models.multilingual.read_bytes())
        assert loading.result(timeout=60).said == OK, server.stderr()[-2000:]
        assert waiting.result(timeout=60)[0] == 200, server.stderr()[-2000:]
    assert health(server.port) == (200, b'{"status":"ok"}')
