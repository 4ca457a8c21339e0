"""The simulated llama-server as a process: both modes, VRAM by PID, answers, lifetimes."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpugate.core.units import GiB
from gpugate_sim.device import SimDevice, SimulatedGpuHost, pid_alive
from gpugate_sim.llamaserver.memory import CUDA_CONTEXT, PlacementOptions, place, plan
from gpugate_sim.llamaserver.model import load_model_info
from gpugate_sim.llamaserver.process import LlamaServerStartError, SimLlamaServer
from gpugate_sim.llamaserver.spec import LlamaServerSpec
from gpugate_sim.serverprocess import child_env
from tests.ports import free_ports
from tests.sim.processes import cmdline, comm

gguf_models = pytest.importorskip("tests.llamaserver.gguf_models")
WAIT = 20.0


def card(tmp_path: Path, total: int = 16 * GiB) -> SimulatedGpuHost:
    return SimulatedGpuHost.create(
        tmp_path / "gpu", [SimDevice(index=0, total=total, reserved=0, uuid="GPU-l", name="sim")]
    )


def request(url: str, body: Any = None, raw: bytes | None = None) -> tuple[int, bytes, Any]:
    data = raw if raw is not None else (None if body is None else json.dumps(body).encode())
    try:
        with urllib.request.urlopen(urllib.request.Request(url, data=data), timeout=WAIT) as r:
            return r.status, r.read(), r.headers
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read(), exc.headers


def wait_for(condition: Any, what: str) -> None:
    deadline = time.monotonic() + WAIT
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def start(argv: list[str], state: Path, port: int) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "gpugate_sim.llamaserver", *argv, "--port", str(port),
         "--sim-state-dir", str(state)],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        env=child_env(),
    )  # fmt: skip

    def up() -> bool:
        assert proc.poll() is None, f"exited with {proc.returncode}"
        try:
            return request(f"http://127.0.0.1:{port}/health")[0] == 200
        except OSError:
            return False

    wait_for(up, "health 200")
    return proc


@pytest.fixture
def model(tmp_path: Path) -> Path:
    return gguf_models.write_tiny_llama(tmp_path / "tiny.gguf")


@pytest.fixture
def single(tmp_path: Path, model: Path) -> Iterator[tuple[str, subprocess.Popen[bytes], Any]]:
    gpu = card(tmp_path)
    (port,) = free_ports(1)
    proc = start(["-m", str(model)], gpu.directory, port)
    try:
        yield f"http://127.0.0.1:{port}", proc, gpu
    finally:
        proc.kill()
        proc.wait(10)


def test_memory_formula_from_the_gguf_header(model: Path) -> None:
    info = load_model_info(model)
    assert (info.n_layer, info.n_ctx_train, info.n_embd, info.n_vocab) == (2, 512, 64, 259)
    whole = plan(info, 512, info.n_layer + 1)
    # KV: n_ctx × layers × (k + v values: 2 heads of 16 each) × 2 bytes (f16).
    assert whole.kv == 512 * 2 * (2 * 16 + 2 * 16) * 2
    assert whole.weights == sum(info.layer_bytes) + info.output_bytes
    # The output layer is the last of the n_layer + 1: one layer offloaded is that one.
    assert plan(info, 512, 1).weights == info.output_bytes
    assert plan(info, 512, 0).total == 0
    assert place(info, PlacementOptions(on_gpu=False), None).total == 0
    # Too little free memory: the auto context is cut first, then layers go.
    tight = place(info, PlacementOptions(fit_min_ctx=256, fit_target=0), whole.total - 1)
    assert tight.n_ctx == 256 and tight.gpu_layers == 3


def test_single_model_holds_vram_under_its_pid_and_frees_it(single: Any) -> None:
    _url, proc, gpu = single
    held = gpu.read().held_by(proc.pid, 0)
    info = load_model_info(cmdline(proc.pid)[2])
    # Its buffers, and the CUDA context it took before the model loaded.
    assert held == plan(info, 512, 3).total + CUDA_CONTEXT
    assert comm(proc.pid) == "llama-server"
    assert cmdline(proc.pid)[0] == "llama-server"
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(WAIT) == 0
    assert gpu.read().processes == []


def test_single_model_answers_as_the_real_server(single: Any, model: Path) -> None:
    url, _, _ = single
    status, body, headers = request(url + "/health")
    assert (status, body) == (200, b'{"status":"ok"}')
    assert headers["Server"] == "llama.cpp"
    status, body, _ = request(url + "/nope")
    assert (status, body) == (
        404, b'{"error":{"message":"File Not Found","type":"not_found_error","code":404}}'
    )  # fmt: skip
    status, body, _ = request(url + "/completion", raw=b"xx")
    assert status == 500 and json.loads(body)["error"]["type"] == "server_error"
    chat = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 5}
    status, body, _ = request(url + "/v1/chat/completions", chat)
    answer = json.loads(body)
    assert list(answer) == [
        "choices", "created", "model", "system_fingerprint", "object", "usage", "id", "timings"
    ]  # fmt: skip
    assert answer["usage"]["prompt_tokens"] == 56 and answer["usage"]["completion_tokens"] == 5
    assert answer["choices"][0]["finish_reason"] == "length"
    assert answer["model"] == str(model)
    status, body, _ = request(url + "/tokenize", {"content": "Hello"})
    assert body == b'{"tokens":[229,153,132,75,104,111,111,114]}'
    status, body, _ = request(url + "/v1/embeddings", {"input": "hi"})
    assert status == 501 and b"--embeddings" in body


def test_streaming_is_sse_ending_with_done(single: Any) -> None:
    url, _, _ = single
    chat = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2, "stream": True}
    _, body, headers = request(url + "/v1/chat/completions", chat)
    assert headers["Content-Type"] == "text/event-stream"
    events = body.split(b"\n\n")
    assert events[-2:] == [b"data: [DONE]", b""]
    first = json.loads(events[0][len(b"data: ") :])
    assert first["choices"][0]["delta"] == {"role": "assistant", "content": None}
    _status, body, _ = request(
        url + "/completion", {"prompt": "Hi", "n_predict": 2, "stream": True}
    )
    assert b"[DONE]" not in body and body.endswith(b"\n\n")


def test_router_loads_in_children_evicts_lru_and_dies_with_its_parent(tmp_path: Path) -> None:
    gpu = card(tmp_path)
    models = tmp_path / "models"
    gguf_models.write_models_dir(models, ["alpha", "beta"])
    (port,) = free_ports(1)
    url = f"http://127.0.0.1:{port}"
    proc = start(["--models-dir", str(models), "--models-max", "1"], gpu.directory, port)
    try:
        listing = json.loads(request(url + "/models")[1])["data"]
        assert [(m["id"], m["status"]["value"]) for m in listing] == [
            ("alpha", "unloaded"), ("beta", "unloaded")
        ]  # fmt: skip
        assert request(url + "/models/load", {"model": "alpha"})[1] == b'{"success":true}'
        status, body, _ = request(url + "/models/load", {"model": "nope"})
        assert (status, json.loads(body)["error"]["message"]) == (404, "File Not Found")
        status, body, _ = request(url + "/models/unload", {"model": "beta"})
        assert (status, json.loads(body)["error"]["message"]) == (400, "model is not running")
        # A request for beta loads it; with --models-max 1 alpha (idle, LRU) goes first.
        chat = {"model": "beta", "messages": [{"role": "user", "content": "x"}], "max_tokens": 1}
        assert request(url + "/v1/chat/completions", chat)[0] == 200
        listing = json.loads(request(url + "/models")[1])["data"]
        assert [m["status"]["value"] for m in listing] == ["unloaded", "loaded"]
        holders = [p.pid for p in gpu.read().processes]
        assert len(holders) == 1 and holders[0] != proc.pid
        child = holders[0]
        assert comm(child) == "llama-server" and "--alias" in cmdline(child)
    finally:
        proc.kill()
        proc.wait(10)
    # The child's stdin reaches EOF when the router dies: it exits with it.
    wait_for(lambda: not pid_alive(child), "the child to exit")
    assert gpu.read().processes == []


def test_sim_llama_server_starts_on_a_free_port_and_again_on_the_same(
    tmp_path: Path, model: Path
) -> None:
    gpu = card(tmp_path)
    spec = LlamaServerSpec(listen="127.0.0.1:0", model=str(model))
    server = SimLlamaServer(spec, gpu.directory, timeout=60.0)
    url = server.start()
    try:
        port = int(url.rsplit(":", 1)[1])
        assert port != 0 and server.listen == f"127.0.0.1:{port}"
        assert request(url + "/health")[:2] == (200, b'{"status":"ok"}')
        # The CUDA context is taken at start, before --fit reads the free memory.
        held = CUDA_CONTEXT + plan(load_model_info(model), 512, 3).total
        assert gpu.read().held_by(server.pid, 0) == held
        first = server.pid
        assert server.stop() == 0
        assert gpu.read().processes == []
        assert server.start() == url and server.pid != first
    finally:
        server.stop()
    assert gpu.read().processes == []


def test_sim_llama_server_that_cannot_load_says_why(tmp_path: Path) -> None:
    gpu = card(tmp_path)
    missing = tmp_path / "absent.gguf"
    server = SimLlamaServer(
        LlamaServerSpec(listen="127.0.0.1:0", model=str(missing)), gpu.directory, timeout=60.0
    )
    with pytest.raises(LlamaServerStartError) as failed:
        server.start()
    assert failed.value.returncode == 1
    assert "exiting due to model loading error" in str(failed.value)
    assert gpu.read().processes == []
