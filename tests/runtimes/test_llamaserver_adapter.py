"""The llama-server runtime: which requests are demands in router mode, how its listing,
its models-max and its errors are read, and what a model's GGUF header makes its envelope."""

from __future__ import annotations

import json

import aiohttp
import attrs
import pytest
from aiohttp import web

from gpugate.config.model import Upstream
from gpugate.core.failures import Failure, FailureClass
from gpugate.core.tickets import LeaseScope
from gpugate.runtimes.base import ApiFamily, RouteKind, Runtime, error_reply, failure_reply
from gpugate.runtimes.gguf import GgufError, read_file
from gpugate.runtimes.llamacpp import CUDA_CONTEXT, LoadOptions, header_shape, load_size
from gpugate.runtimes.llamaserver.catalog import LlamaServerError, ModelEntry, parse_models
from gpugate.runtimes.llamaserver.memory import context_cap, footprint
from gpugate.runtimes.llamaserver.reading import Unreadable, read_json
from gpugate.runtimes.llamaserver.router import RouterReading, RouterState, router_runtime
from gpugate.runtimes.llamaserver.single import LlamaSingleReading
from gpugate.runtimes.registry import runtime_for
from gpugate.runtimes.sections import load_config_text
from tests.llamaserver.gguf_models import write_tiny_llama

CONFIG = """\
consumers:
  llama:
    runtime: llama-server
    listen: 127.0.0.1:8090
    upstream: http://127.0.0.1:8091
  single:
    runtime: llama-server
    listen: 127.0.0.1:8092
    upstream: http://127.0.0.1:8093
    envelope: 1GiB
    control:
      command: [llama-server, -m, /models/qwen.gguf, --port, "8093"]
"""


@pytest.fixture
def consumers():
    config = load_config_text(CONFIG, "consumers.yaml")
    return {c.name: c for c in config.consumers}


@pytest.fixture
def runtime(consumers) -> Runtime:
    runtime = runtime_for(consumers["llama"])
    assert runtime is not None and isinstance(runtime.reading, RouterReading)
    return runtime


@pytest.fixture
def router(runtime) -> RouterReading:
    assert isinstance(runtime.reading, RouterReading)
    return runtime.reading


@pytest.fixture
def state(router) -> RouterState:
    return router.state


def listing(*rows: tuple[str, str], args: tuple[str, ...] = ()) -> dict:
    return {
        "object": "list",
        "data": [
            {
                "id": name,
                "aliases": [name + "-alias"],
                "status": {"value": status, "args": list(args)},
            }
            for name, status in rows
        ],
    }


def test_a_consumer_with_a_control_is_a_single_model_server(consumers):
    runtime = runtime_for(consumers["single"])
    assert runtime is not None and isinstance(runtime.reading, LlamaSingleReading)
    assert runtime.inventory is None and runtime.vetting is None
    lifecycle = runtime.lifecycle
    assert lifecycle.process_model() == "/models/qwen.gguf"
    assert lifecycle.needs_process("POST", "/v1/chat/completions")
    assert not lifecycle.needs_process("GET", "/health")
    assert runtime.reading.classify("POST", "/completion", None, "").api is ApiFamily.LLAMA


def test_a_router_is_listed_vetted_and_sized_by_its_catalog(runtime):
    assert runtime.lifecycle is None and runtime.jobs is None
    parts = (runtime.reading, runtime.vetting, runtime.inventory, runtime.memory)
    assert {part.state for part in parts} == {runtime.reading.state}, "one catalog, shared"


@pytest.mark.parametrize(
    "path", ["/v1/chat/completions", "/completion", "/v1/embeddings", "/infill", "/tokenize"]
)
def test_a_proxied_route_naming_a_model_is_a_demand_for_it(router, state, path):
    state.catalog = parse_models(listing(("qwen", "unloaded")))
    classified = router.classify("POST", path, b'{"model": "qwen-alias", "prompt": "x"}', "")
    assert classified.kind is RouteKind.DEMAND
    assert classified.model == "qwen"  # an alias resolves to the model's own name
    assert classified.scope is LeaseScope.REQUEST
    assert classified.api is ApiFamily.LLAMA


@pytest.mark.parametrize(
    "body",
    [
        b"{not json",
        b'{"prompt": "x"}',
        b'{"model": 7}',
        b'{"model": ""}',
        b"[1]",
        b'{"model": NaN}',
    ],
)
def test_a_body_the_router_refuses_unread_passes_unleased(router, body):
    assert router.classify("POST", "/completion", body, "").kind is RouteKind.PASS


def test_json_the_gate_cannot_read_as_nlohmann_does_is_refused_in_llamas_shape(router):
    deep = b'{"model": "qwen", "x": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    classified = router.classify("POST", "/completion", deep, "")
    assert classified.kind is RouteKind.REFUSE
    assert classified.refusal is not None and classified.refusal.status == 400
    with pytest.raises(Unreadable):
        read_json(deep)


def test_a_lone_surrogate_is_refused_as_nlohmann_refuses_it():
    with pytest.raises(ValueError):
        read_json(b'{"model": "q\\ud800"}')
    assert read_json(b'{"model": "q\\ud83d\\ude00"}') == {"model": "q\U0001f600"}


def test_a_get_names_its_model_in_the_query(router):
    classified = router.classify("GET", "/props", None, "", query="model=qwen&autoload=false")
    assert classified.kind is RouteKind.DEMAND
    assert classified.model == "qwen"
    assert classified.reading is False
    assert router.classify("GET", "/props", None, "").kind is RouteKind.PASS
    assert router.classify("GET", "/health", None, "").kind is RouteKind.PASS
    assert router.classify("GET", "/models", None, "").kind is RouteKind.PASS


def test_load_holds_its_lease_until_the_child_shows_and_unload_is_an_unload(router):
    load = router.classify("POST", "/models/load", b'{"model": "qwen"}', "")
    assert (load.kind, load.model, load.scope) == (RouteKind.DEMAND, "qwen", LeaseScope.PROCESS)
    assert load.appear_within is not None and load.appear_within > 0
    unload = router.classify("POST", "/models/unload", b'{"model": "qwen"}', "")
    assert (unload.kind, unload.model) == (RouteKind.UNLOAD, "qwen")
    assert router.classify("POST", "/models/unload", b"{}", "").kind is RouteKind.PASS


def test_at_models_max_the_gate_makes_the_room_and_names_no_victim(runtime, router, state):
    state.catalog = parse_models(listing(("a", "loaded"), ("b", "loaded"), ("c", "unloaded")))
    residents = runtime.residents
    assert residents.most_models is None  # unread: no limit known yet
    state.models_max = 2
    assert residents.most_models == 2
    # The books choose whom to evict (gpugate/core/crowding.py), not a guess at the
    # router's own LRU clock from a listing.
    assert router.classify("POST", "/completion", b'{"model": "c"}', "").replaces is None
    assert router.classify("POST", "/models/load", b'{"model": "c"}', "").replaces is None
    state.models_max = 0  # --models-max 0: unlimited
    assert residents.most_models is None


async def serve_router(aiohttp_server, rows: dict, props: dict):
    calls: list[tuple[str, object]] = []

    async def models(request):
        return web.json_response(rows)

    async def get_props(request):
        return web.json_response(props)

    async def unload(request):
        body = await request.json()
        calls.append(("unload", body))
        if body["model"] == "gone":
            return web.json_response(
                {
                    "error": {
                        "code": 400,
                        "message": "model is not running",
                        "type": "invalid_request_error",
                    }
                },
                status=400,
            )
        if body["model"] == "broken":
            return web.Response(status=500, text="Internal Server Error")
        return web.json_response({"success": True})

    app = web.Application()
    app.router.add_get("/models", models)
    app.router.add_get("/props", get_props)
    app.router.add_post("/models/unload", unload)
    return await aiohttp_server(app), calls


async def test_vet_passes_what_the_router_would_refuse(aiohttp_server, consumers):
    rows = listing(("qwen", "unloaded"), ("phi", "loaded"))
    server, _ = await serve_router(
        aiohttp_server, rows, {"role": "router", "max_instances": 4, "models_autoload": False}
    )
    consumer = consumers["llama"]

    runtime = router_runtime(
        attrs.evolve(consumer, upstream=Upstream("http", "127.0.0.1", server.port))
    )
    reading, vetting = runtime.reading, runtime.vetting
    assert isinstance(reading, RouterReading) and vetting is not None

    async with aiohttp.ClientSession() as session:
        unknown = reading.classify("POST", "/completion", b'{"model": "nope"}', "")
        assert await vetting.vet(unknown, session, 0.0) is not None
        # --no-models-autoload: a model not running is refused (400) without loading.
        cold = reading.classify("POST", "/completion", b'{"model": "qwen"}', "")
        assert await vetting.vet(cold, session, 0.0) is not None
        warm = reading.classify("POST", "/completion", b'{"model": "phi"}', "")
        assert await vetting.vet(warm, session, 0.0) is None
        asked = reading.classify(
            "POST", "/completion?autoload=1", b'{"model": "qwen"}', "", query="autoload=1"
        )
        assert await vetting.vet(asked, session, 0.0) is None
        # A load of a model a listing calls running is leased all the same: the router
        # may have unloaded it since, and the books say whether it is held.
        running = reading.classify("POST", "/models/load", b'{"model": "phi"}', "")
        assert await vetting.vet(running, session, 0.0) is None
        unknown_load = reading.classify("POST", "/models/load", b'{"model": "nope"}', "")
        assert await vetting.vet(unknown_load, session, 0.0) is not None
        assert reading.state.models_max == 4 and reading.state.autoload is False
        assert runtime.residents.most_models == 4
        loaded = await runtime.inventory.listing(session)
        assert [m.name for m in loaded] == ["phi"]


async def test_evict_unloads_and_a_model_already_gone_is_evicted(aiohttp_server, consumers):

    server, calls = await serve_router(aiohttp_server, listing(), {"role": "router"})
    residents = router_runtime(
        attrs.evolve(consumers["llama"], upstream=Upstream("http", "127.0.0.1", server.port))
    ).residents
    async with aiohttp.ClientSession() as session:
        await residents.evict(session, "qwen")
        await residents.evict(session, "gone")
        with pytest.raises(LlamaServerError, match="500"):
            await residents.evict(session, "broken")
    assert calls == [
        ("unload", {"model": "qwen"}),
        ("unload", {"model": "gone"}),
        ("unload", {"model": "broken"}),
    ]


def test_errors_are_written_in_llama_servers_shape():
    reply = error_reply(ApiFamily.LLAMA, 400, "model 'x' not found")
    assert reply.content_type == "application/json; charset=utf-8"
    # The router's own bytes for an unknown model, as it wrote them (compact, this order).
    expected = b'{"error":{"code":400,"message":"model \'x\' not found",'
    expected += b'"type":"invalid_request_error"}}'
    assert reply.body == expected
    failure = failure_reply(
        ApiFamily.LLAMA, Failure(FailureClass.LEASE_TIMEOUT, "no room", retry_after=5.0)
    )
    body = json.loads(failure.body)
    assert body["error"]["code"] == failure.status == FailureClass.LEASE_TIMEOUT.http_status
    assert body["error"]["type"] == "unavailable_error"
    assert failure.retry_after == 5.0


def test_a_listing_that_is_not_one_is_an_error():
    with pytest.raises(LlamaServerError):
        parse_models({"data": "x"})
    with pytest.raises(LlamaServerError):
        parse_models({"data": [{"status": {}}]})
    # A single-model server lists its one model without a router's status: it is loaded.
    assert parse_models({"data": [{"id": "m.gguf"}]}).entries[0].status == "loaded"


def test_the_envelope_is_weights_kv_cache_and_buffer_from_the_gguf_header(tmp_path):
    path = write_tiny_llama(tmp_path / "tiny.gguf", n_layer=2, n_embd=64, n_head=4, n_head_kv=2)
    shape = header_shape(read_file(path))
    assert shape is not None
    assert (shape.n_layer, shape.n_embd, shape.n_head, shape.n_head_kv) == (2, 64, 4, (2, 2))
    assert 0 < shape.weights <= path.stat().st_size
    entry = ModelEntry("tiny", "unloaded", args=("llama-server", "-m", str(path), "-c", "512"))
    found = footprint(entry.option("-m"), entry.option)
    assert found is not None and not found.degrades  # -c set: --fit does not cut it
    expected = load_size(shape, LoadOptions(n_ctx=512, n_parallel=4, unified=True))
    assert found.ceiling == expected.total
    # head_dim 16 × 2 kv heads × (K + V) × 2 layers × 2 bytes a cell, 512 cells
    assert expected.kv == 2 * 512 * (32 + 32) * 2
    assert expected.context == CUDA_CONTEXT
    no_gpu = ModelEntry("tiny", "unloaded", args=("-m", str(path), "-ngl", "0"))
    found = footprint(no_gpu.option("-m"), no_gpu.option)
    assert found is not None and found.ceiling < CUDA_CONTEXT  # held in host memory
    assert footprint(str(tmp_path / "missing"), no_gpu.option) is None


def test_an_unset_context_is_fitted_between_the_fit_context_and_the_trained_one(tmp_path):
    path = write_tiny_llama(tmp_path / "long.gguf", context_length=32768)
    entry = ModelEntry("long", "unloaded", args=("-m", str(path)))
    found = footprint(str(path), entry.option)
    assert found is not None and found.degrades
    shape = header_shape(read_file(path))
    assert shape is not None
    options = LoadOptions(n_parallel=4, unified=True)
    assert found.ceiling == load_size(shape, options).total
    assert found.floor == load_size(shape, attrs.evolve(options, n_ctx=4096)).total
    fixed = ModelEntry("long", "unloaded", args=("-m", str(path), "--fit", "off"))
    off = footprint(str(path), fixed.option)
    assert off is not None and not off.degrades
    cap = context_cap(str(path), entry.option, found.floor + 1)
    assert cap is not None and cap.args == ("-c", "4096")


def test_a_file_that_is_not_gguf_is_refused(tmp_path):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGML" + bytes(64))
    with pytest.raises(GgufError):
        read_file(bad)
    truncated = tmp_path / "short.gguf"
    path = write_tiny_llama(tmp_path / "full.gguf")
    truncated.write_bytes(path.read_bytes()[:40])
    with pytest.raises(GgufError):
        read_file(truncated)
