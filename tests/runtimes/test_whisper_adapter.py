"""The whisper-server runtime: what passes, what a /load demands, how it is evicted."""

from __future__ import annotations

import aiohttp
import pytest

from gpugate.core.tickets import LeaseScope
from gpugate.core.units import MiB
from gpugate.runtimes.base import RouteKind
from gpugate.runtimes.http import http_runtime
from gpugate.runtimes.process_supervised import SupervisedCommand
from gpugate.runtimes.process_systemd import SystemdUnit
from gpugate.runtimes.sections import load_config_text
from gpugate.runtimes.whisper.adapter import whisper_runtime

CONFIG = """\
consumers:
  whisper:
    runtime: whisper
    listen: 127.0.0.1:8080
    upstream: http://127.0.0.1:8081
    envelope: 2050MiB
    models:
      models/ggml-base.en.bin: {envelope: 200MiB}
    control:
      command: [python3, -m, sim, -m, models/ggml-large-v3-turbo.bin, --port, "8081"]
      stop_timeout: 7s
      start_admission_timeout: 30s
  unit:
    runtime: whisper
    listen: 127.0.0.1:8090
    upstream: http://127.0.0.1:8091
    envelope: 1GiB
    control: {unit: whisper-server.service}
  mvoice:
    runtime: http
    listen: 127.0.0.1:7860
    upstream: http://127.0.0.1:7861
    envelope: 292MiB
"""


@pytest.fixture
def config(tmp_path):
    return load_config_text(CONFIG, tmp_path / "consumers.yaml")


@pytest.fixture
def whisper(config):
    return whisper_runtime(config.consumers[0])


async def form_body(**fields: str) -> tuple[bytes, str]:
    """A multipart/form-data body as curl -F sends it, and its Content-Type."""
    with aiohttp.MultipartWriter("form-data") as writer:
        for name, value in fields.items():
            part = writer.append(value, {"Content-Type": "text/plain"})
            part.set_content_disposition("form-data", name=name)

    class Sink:
        def __init__(self) -> None:
            self.data = b""

        async def write(self, chunk: bytes) -> None:
            self.data += chunk

    sink = Sink()
    await writer.write(sink)  # type: ignore[arg-type]
    return sink.data, writer.content_type


def test_the_process_model_is_the_commands_own_m_option(whisper):
    assert whisper.lifecycle.process_model() == "models/ggml-large-v3-turbo.bin"
    assert whisper.settings.configured_envelope("models/ggml-large-v3-turbo.bin") == 2050 * MiB
    assert whisper.settings.configured_envelope("models/ggml-base.en.bin") == 200 * MiB


@pytest.mark.parametrize(
    ("method", "path"),
    [("POST", "/inference"), ("GET", "/health"), ("GET", "/"), ("OPTIONS", "/inference")],
)
def test_requests_other_than_load_pass_untouched_and_unread(whisper, method, path):
    assert not whisper.reading.wants_body(method, path)
    classified = whisper.reading.classify(method, path, None, "")
    assert classified.kind is RouteKind.PASS and classified.body is None


async def test_load_of_another_model_is_a_process_demand_for_its_envelope(whisper):
    body, content_type = await form_body(model="models/ggml-base.en.bin")
    assert whisper.reading.wants_body("POST", "/load")
    classified = whisper.reading.classify("POST", "/load", body, content_type)
    assert classified.kind is RouteKind.DEMAND
    assert classified.scope is LeaseScope.PROCESS
    assert classified.model == "models/ggml-base.en.bin"
    assert classified.appear_within == 30.0
    assert classified.body is None, "forwarded as it came"
    assert classified.replaces == "models/ggml-large-v3-turbo.bin"
    whisper.lifecycle.answered(classified, 400)
    assert whisper.lifecycle.process_model() == "models/ggml-large-v3-turbo.bin", "refused"
    whisper.lifecycle.answered(classified, 200)
    assert whisper.lifecycle.process_model() == "models/ggml-base.en.bin"
    # The reading and the lifecycle share the process's model: the next switch replaces it.
    again = whisper.reading.classify("POST", "/load", body, content_type)
    assert again.replaces == "models/ggml-base.en.bin"


@pytest.mark.parametrize("status", [200, 201, 204, 302, 400])
async def test_a_switch_took_effect_only_when_answered_200_by_the_books_and_process_alike(
    whisper, status
):
    # server.cpp's /load answers 200 `Load was successful!` or 400 (or exits): one rule
    # for the gate's books (`Reading.loaded_by`) and the process's current model.
    body, content_type = await form_body(model="models/ggml-base.en.bin")
    classified = whisper.reading.classify("POST", "/load", body, content_type)
    whisper.lifecycle.answered(classified, status)
    switched = whisper.lifecycle.process_model() == "models/ggml-base.en.bin"
    assert whisper.reading.loaded_by(classified, status) is switched is (status == 200)


@pytest.mark.parametrize("method", ["GET", "HEAD"])
def test_its_health_answered_in_its_place_carries_its_own_headers(whisper, method):
    up = whisper.lifecycle.up_health(method)
    assert (up.status, up.body, up.content_type) == (200, b'{"status":"ok"}', "application/json")
    headers = dict(up.headers)
    assert headers.pop("Server") == "whisper.cpp"
    assert headers.pop("Access-Control-Allow-Origin") == "*"
    assert headers.pop("Access-Control-Allow-Headers") == "content-type, authorization"
    assert headers == ({"Accept-Ranges": "bytes"} if method == "HEAD" else {})


async def test_load_of_the_model_it_runs_is_a_demand_too(whisper):
    # whisper-server frees its model and loads the one named, the same one included; and a
    # /load queued before this one may have switched it by the time this one runs.
    same, content_type = await form_body(model="models/ggml-large-v3-turbo.bin")
    classified = whisper.reading.classify("POST", "/load", same, content_type)
    assert (classified.kind, classified.model) == (
        RouteKind.DEMAND,
        "models/ggml-large-v3-turbo.bin",
    )


async def test_load_whisper_answers_without_allocating_passes(whisper):
    other, content_type = await form_body(file="x")
    assert whisper.reading.classify("POST", "/load", other, content_type).kind is RouteKind.PASS
    form = b"model=models%2Fggml-base.en.bin"
    urlencoded = "application/x-www-form-urlencoded"
    kind = whisper.reading.classify("POST", "/load", form, urlencoded).kind
    assert kind is RouteKind.PASS, "whisper-server reads only multipart fields"


def test_eviction_is_a_stop_confirmed_by_the_consumers_memory_gone(whisper, config):
    rule = whisper.residents.reclaim_rule
    assert rule.consumer_clear
    assert rule.recovered_fraction == 1.0
    keep_alive = whisper.reading.keep_alive
    assert not keep_alive.pools_idle, "cpp-httplib closes idle connections after 5 s"
    control = whisper.lifecycle.control
    assert isinstance(control, SupervisedCommand)
    assert control.stop_grace == 7.0
    timeouts = config.consumers[0].timeouts
    assert whisper.residents.evict_timeout() == 7.0 + timeouts.control
    unit = whisper_runtime(config.consumers[1]).lifecycle
    assert isinstance(unit.control, SystemdUnit) and unit.control.unit == "whisper-server.service"
    assert unit.process_model() == "models/ggml-base.en.bin", "whisper-server's default"


async def test_an_uncontrolled_process_cannot_be_evicted(config):
    from gpugate.runtimes.base import NotSupported

    mvoice = http_runtime(config.consumers[2])
    assert mvoice.lifecycle.control is None
    assert mvoice.settings.configured_envelope(mvoice.lifecycle.process_model()) == 292 * MiB
    assert mvoice.reading.classify("POST", "/tts", b"", "").kind is RouteKind.PASS
    with pytest.raises(NotSupported):
        await mvoice.residents.evict(None, "<process>")  # type: ignore[arg-type]


def curl_form(path: str, *, pad: int = 0) -> bytes:
    """`curl -F model=PATH [-F pad=@FILE]`'s body (boundary `X`)."""
    body = b""
    if pad:
        body += b'--X\r\nContent-Disposition: form-data; name="pad"; filename="p"\r\n\r\n'
        body += b"p" * pad + b"\r\n"
    body += b'--X\r\nContent-Disposition: form-data; name="model"\r\n\r\n' + path.encode()
    return body + b"\r\n--X--\r\n"


def two_models(first: bytes, second: bytes) -> bytes:
    head = b'--X\r\nContent-Disposition: form-data; name="model"\r\n\r\n'
    return head + first + b"\r\n" + head + second + b"\r\n--X--\r\n"


def test_a_load_of_any_size_is_read_and_leased(whisper):
    # curl :8080/load -F model=models/ggml-base.en.bin -F pad=@70KB.bin
    classified = whisper.reading.classify(
        "POST",
        "/load",
        curl_form("models/ggml-base.en.bin", pad=70_000),
        "multipart/form-data; boundary=X",
    )
    assert (classified.kind, classified.model) == (RouteKind.DEMAND, "models/ggml-base.en.bin")


@pytest.mark.parametrize(
    ("content_type", "model"),
    [
        ("multipart/form-data; xboundary=X; boundary=Y", "models/ggml-base.en.bin"),
        ("multipart/form-data; xboundary=Y; boundary=X", None),
        ("multipart%2Fform-data; boundary%3DX", "models/ggml-base.en.bin"),
        ("  multipart/form-data; boundary=X\t", "models/ggml-base.en.bin"),
        ("Multipart/form-data; boundary=X", None),
    ],
)
def test_the_content_type_is_read_as_cpp_httplib_reads_it(whisper, content_type, model):
    classified = whisper.reading.classify(
        "POST", "/load", curl_form("models/ggml-base.en.bin"), content_type
    )
    assert classified.model == model
    assert classified.kind is (RouteKind.DEMAND if model else RouteKind.PASS)


def test_an_encoded_part_is_leased_as_sent(whisper):
    body = (
        b'--X\r\nContent-Disposition: form-data; name="model"\r\n'
        b"Content-Transfer-Encoding: base64\r\n\r\nbW9kZWxzL2dnbWwtYmFzZS5lbi5iaW4=\r\n--X--\r\n"
    )
    classified = whisper.reading.classify("POST", "/load", body, "multipart/form-data; boundary=X")
    assert classified.model == "bW9kZWxzL2dnbWwtYmFzZS5lbi5iaW4=", "whisper-server does not decode"


@pytest.mark.parametrize(
    "body",
    [
        # Two models: which one loads depends on where the server's reads split the body.
        two_models(b"a.bin", b"b.bin"),
        # A delimiter line inside a part: a read split before it starts the parts there.
        curl_form("a.bin", pad=10).replace(b"pppp", b"p--X\r\n", 1),
        # After the close, a read starting with CRLF is read as more parts.
        curl_form("a.bin") + b'\r\nContent-Disposition: form-data; name="model"\r\n\r\nb.bin',
    ],
)
def test_a_load_whose_reading_could_differ_is_refused_as_whisper_refuses_a_form(whisper, body):
    classified = whisper.reading.classify("POST", "/load", body, "multipart/form-data; boundary=X")
    assert classified.kind is RouteKind.REFUSE
    assert classified.refusal is not None and classified.refusal.exact is not None
    exact = classified.refusal.exact
    assert (exact.status, exact.body, exact.content_type) == (400, b"Invalid request", "text/plain")
    assert ("Access-Control-Allow-Origin", "*") in exact.headers


def test_two_model_parts_naming_one_file_are_one_demand(whisper):
    body = two_models(b"a.bin", b"a.bin\0x")
    classified = whisper.reading.classify("POST", "/load", body, "multipart/form-data; boundary=X")
    assert (classified.kind, classified.model) == (RouteKind.DEMAND, "a.bin")


def test_the_load_route_and_content_type_are_screened_as_cpp_httplib_reads_them(whisper):
    from multidict import CIMultiDict, CIMultiDictProxy

    def screen(target: str, *types: str) -> bool:
        headers = CIMultiDictProxy(CIMultiDict([("Content-Type", t) for t in types]))
        return whisper.reading.screen("POST", headers, target=target).reply is not None

    assert not screen("/load", "multipart/form-data; boundary=X")
    assert not screen("/lo%61d", "multipart/form-data; boundary=X"), "the gate decodes it too"
    assert screen("/%u006coad", "multipart/form-data; boundary=X"), "only cpp-httplib decodes %u"
    assert screen("/load", "multipart/form-data; boundary=X", "multipart/form-data; boundary=Y")
    assert not screen("/load", "multipart/form-data; boundary=X", "multipart/form-data; boundary=X")
    assert not screen("/inference", "a", "b"), "only a /load is read"
    none = CIMultiDictProxy(CIMultiDict())
    assert whisper.reading.screen("GET", none, target="/%u006coad").reply is None


def test_a_request_path_moves_the_load_route(config, tmp_path):
    text = CONFIG.replace('"8081"]', '"8081", --request-path, /api]')
    consumer = load_config_text(text, tmp_path / "c.yaml").consumers[0]
    reading = whisper_runtime(consumer).reading
    assert reading.wants_body("POST", "/api/load") and not reading.wants_body("POST", "/load")
