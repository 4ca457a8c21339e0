"""The whisper-server runtime: what passes, what a /load demands, how it is evicted."""

from __future__ import annotations

import aiohttp
import pytest

from gpugate.core.tickets import LeaseScope
from gpugate.core.units import MiB
from gpugate.runtimes.base import RouteKind
from gpugate.runtimes.http import http_runtime
from gpugate.runtimes.process import SupervisedCommand, SystemdUnit
from gpugate.runtimes.sections import load_config_text
from gpugate.runtimes.whisper.adapter import multipart_field, whisper_runtime

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


async def test_multipart_field_reads_the_named_part():
    body, content_type = await form_body(a="1", model="/srv/m.bin")
    assert multipart_field(body, content_type, "model") == "/srv/m.bin"
    assert multipart_field(body, content_type, "missing") is None
    assert multipart_field(b"garbage", content_type, "model") is None


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
