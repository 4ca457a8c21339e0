"""The registry maps runtime kinds to adapters; the Ollama adapter answers the interface."""

from __future__ import annotations

from pathlib import Path

import aiohttp
import attrs
import pytest
from aiohttp import web

from gpugate.config.model import Upstream
from gpugate.core.tickets import LeaseScope
from gpugate.runtimes.base import HealthSignal, ReclaimRule, RouteKind, RuntimeAdapter
from gpugate.runtimes.http import HttpAdapter
from gpugate.runtimes.ollama.adapter import OllamaAdapter
from gpugate.runtimes.registry import ADAPTERS, adapter_class, adapter_for
from gpugate.runtimes.sections import RUNTIME_TABLE, load_config
from gpugate.runtimes.whisper.adapter import WhisperAdapter
from tests.runtimes.test_ollama_adapter import CONSUMER


def test_ollama_consumers_get_the_ollama_adapter():
    adapter = adapter_for(CONSUMER)
    assert isinstance(adapter, OllamaAdapter)
    assert isinstance(adapter, RuntimeAdapter)
    assert adapter.consumer is CONSUMER


@pytest.mark.parametrize("kind", RUNTIME_TABLE.names)
def test_every_runtime_kind_is_fronted_by_an_adapter(kind):
    assert adapter_class(kind) is not None
    assert isinstance(adapter_for(attrs.evolve(CONSUMER, runtime=kind)), RuntimeAdapter)


@pytest.mark.parametrize(("kind", "cls"), [("whisper", WhisperAdapter), ("http", HttpAdapter)])
def test_process_runtimes_have_adapters(kind, cls):
    assert isinstance(adapter_for(attrs.evolve(CONSUMER, runtime=kind)), cls)


def test_the_runtimes_with_a_section_are_the_runtimes_with_an_adapter():
    assert list(RUNTIME_TABLE.names) == list(ADAPTERS)


def test_every_registered_factory_builds_a_runtime_adapter():
    for kind, factory in ADAPTERS.items():
        assert isinstance(factory(attrs.evolve(CONSUMER, runtime=kind)), RuntimeAdapter)


def test_ollama_adapter_parameters():
    adapter = OllamaAdapter(CONSUMER)
    assert adapter.reconcilable is True
    assert adapter.reclaim_rule == ReclaimRule(recovered_fraction=0.75)
    body = b'{"model": "bge-m3", "prompt": "hi"}'
    classified = adapter.classify("POST", "/api/generate", body, "application/json")
    assert classified.kind is RouteKind.DEMAND
    assert classified.scope is LeaseScope.REQUEST


def test_shared_lookups_resolve_names_as_the_runtime_does():
    adapter = OllamaAdapter(CONSUMER)
    # `library/bge-m3:latest` is Ollama's full spelling of `bge-m3`.
    assert adapter.model_priority("library/bge-m3:latest") is adapter.model_priority("bge-m3")
    assert adapter.residency("BGE-M3").ttl == 901.0
    assert adapter.configured_envelope("bge-m3") is None
    assert adapter.reload_seconds("bge-m3", 2 * 1024**3) == pytest.approx(2.0)


@pytest.mark.parametrize(("status", "healthy"), [(200, True), (500, False)])
async def test_ollama_health_is_api_version(aiohttp_server, status, healthy):
    seen = []

    async def version(request: web.Request) -> web.Response:
        seen.append(request.headers["Host"])
        return web.json_response({"version": "0.33.0"}, status=status)

    app = web.Application()
    app.router.add_get("/api/version", version)
    server = await aiohttp_server(app)
    consumer = attrs.evolve(CONSUMER, upstream=Upstream("http", "127.0.0.1", server.port))
    async with aiohttp.ClientSession() as session:
        assert await OllamaAdapter(consumer).health(session) is healthy
    assert seen == [f"127.0.0.1:{server.port}"]


def test_a_runtime_the_gate_only_fronts_never_fails_health_by_a_guessed_route():
    # The demo's mVoice: `runtime: http`, no control, no known health route.
    config = load_config(Path(__file__).parents[2] / "gpugate/sim/data/demo-consumers.yaml")
    signals = {
        c.name: adapter.health_signal
        for c in config.consumers
        if (adapter := adapter_for(c)) is not None
    }
    assert signals["mvoice"] is HealthSignal.UNOBSERVED
    assert signals["whisper"] is HealthSignal.PROCESS
    assert signals["ollama"] is HealthSignal.LISTING
