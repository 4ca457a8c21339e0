"""A sim-only size for a llama-server model file: `--sim-model-size NAME=SIZE`.

Tiny test models hold a few hundred KiB; an incident needs models of gigabytes. As for the
simulated whisper-server, a size given on the command line (or as `models:` in the
`llamaserver:` host section) replaces the file's weights on the simulated GPU, while the
KV cache and compute buffer still come from its GGUF header. A router passes the option on
to its children, which do not show it in their command line.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpugate.core.units import GiB, MiB
from gpugate_sim.llamaserver.cli import parse_args
from gpugate_sim.llamaserver.memory import CUDA_CONTEXT, plan
from gpugate_sim.llamaserver.model import load_model_info, sized_for, with_weights
from gpugate_sim.llamaserver.process import llamaserver_argv
from gpugate_sim.llamaserver.spec import parse_llamaserver
from gpugate_sim.scenario import load_host
from tests.ports import free_ports
from tests.sim.processes import cmdline, comm
from tests.sim.test_sim_llamaserver import card, request, start, wait_for

gguf_models = pytest.importorskip("tests.llamaserver.gguf_models")


@pytest.fixture
def model(tmp_path: Path) -> Path:
    return gguf_models.write_tiny_llama(tmp_path / "alpha.gguf")


def test_a_size_replaces_the_weights_and_keeps_the_cache_and_buffer(model: Path) -> None:
    info = load_model_info(model)
    sized = with_weights(info, 3 * GiB + 1)
    own, big = plan(info, 512, info.n_layer + 1), plan(sized, 512, sized.n_layer + 1)
    assert own.weights < 1 * MiB
    assert big.weights == 3 * GiB + 1
    assert (big.kv, big.compute) == (own.kv, own.compute) and own.kv > 0 and own.compute > 0
    # Each part keeps its share of the file: fewer layers offloaded, fewer bytes.
    for layer, part in zip(sized.layer_bytes, info.layer_bytes, strict=True):
        assert layer == (3 * GiB + 1) * part // sum((*info.layer_bytes, info.output_bytes))
    assert plan(sized, 512, 2).weights == sized.layer_bytes[-1] + sized.output_bytes < big.weights
    assert sized.size == info.input_bytes + 3 * GiB + 1
    assert sized.tokens == info.tokens and sized.n_ctx_train == info.n_ctx_train


def test_a_size_is_found_by_the_path_as_given_or_the_file_name() -> None:
    sizes = {"alpha.gguf": 1, "/srv/gguf/beta.gguf": 2}
    assert sized_for(sizes, "/models/alpha.gguf") == 1
    assert sized_for(sizes, "/srv/gguf/beta.gguf") == 2
    assert sized_for(sizes, "/elsewhere/beta.gguf") is None
    assert sized_for(sizes, "/models/gamma.gguf") is None


def test_the_option_on_the_command_line() -> None:
    args = parse_args(["--models-dir", "d", "--sim-model-size", "alpha.gguf=3GiB",
                       "--sim-model-size=beta.gguf=1073741824"])  # fmt: skip
    assert args.sim_model_sizes == {"alpha.gguf": 3 * GiB, "beta.gguf": GiB}
    for bad in ("alpha.gguf", "=3GiB", "alpha.gguf=lots"):
        with pytest.raises(ValueError, match="--sim-model-size"):
            parse_args(["--sim-model-size", bad])


def test_the_host_section_gives_the_option(tmp_path: Path) -> None:
    spec = parse_llamaserver(
        {"models_dir": "m", "models": {"alpha.gguf": "3GiB", "beta.gguf": 512 * MiB}}, tmp_path
    )
    assert spec.models == {"alpha.gguf": 3 * GiB, "beta.gguf": 512 * MiB}
    assert spec.listen == "127.0.0.1:8082"  # the default when the section gives none
    argv = llamaserver_argv(spec, tmp_path / "state")
    pairs = [argv[i + 1] for i, word in enumerate(argv) if word == "--sim-model-size"]
    assert pairs == [f"alpha.gguf={3 * GiB}", f"beta.gguf={512 * MiB}"]
    assert parse_args(argv[3:]).sim_model_sizes == spec.models
    for bad, message in (
        ({"models_dir": "m", "models": ["alpha.gguf"]}, "llamaserver.models: expected a mapping"),
        ({"models_dir": "m", "models": {"alpha.gguf": "big"}}, "llamaserver.models.alpha.gguf"),
    ):
        with pytest.raises(ValueError, match=message):
            parse_llamaserver(bad, tmp_path)
    # A whole host file with it loads (what `gpugate sim run` reads).
    host = tmp_path / "host.yaml"
    host.write_text(
        "gpus: [{total: 16GiB}]\n"
        "llamaserver: {models_dir: m, models: {alpha.gguf: 3GiB}, n_gpu_layers: all}\n"
    )
    assert load_host(host).llamaserver.models == {"alpha.gguf": 3 * GiB}


def test_a_router_passes_the_size_to_its_children(tmp_path: Path) -> None:
    gpu = card(tmp_path, total=8 * GiB)
    models = tmp_path / "models"
    gguf_models.write_models_dir(models, ["alpha", "beta", "gamma"])
    tiny = plan(load_model_info(models / "beta.gguf"), 512, 3)
    (port,) = free_ports(1)
    url = f"http://127.0.0.1:{port}"
    sizes = ["--sim-model-size", "alpha.gguf=3GiB", "--sim-model-size", "gamma.gguf=6GiB"]
    proc = start(["--models-dir", str(models), "-ngl", "all", *sizes], gpu.directory, port)
    try:
        for name in ("alpha", "beta"):
            assert request(url + "/models/load", {"model": name})[0] == 200

        def status() -> dict[str, dict]:
            listing = json.loads(request(url + "/models")[1])["data"]
            return {m["id"]: m["status"] for m in listing}

        wait_for(lambda: status()["alpha"]["value"] == status()["beta"]["value"] == "loaded",
                 "alpha and beta loaded")  # fmt: skip
        held = {p.pid: p.used for p in gpu.read().processes}
        # beta holds its own tensors; alpha the size given, and the same cache and buffer.
        context = CUDA_CONTEXT
        assert sorted(held.values()) == [
            tiny.total + context,
            3 * GiB + tiny.kv + tiny.compute + context,
        ]
        for pid in held:
            # Shown as llama-server, without the simulator's options.
            assert comm(pid) == "llama-server"
            words = cmdline(pid)
            assert words[0] == "llama-server" and "--alias" in words
            assert not any(w.startswith("--sim-") for w in words)
        assert not any("--sim-" in w for s in status().values() for w in s["args"])
        # 6 GiB of weights do not fit beside alpha on 8 GiB: the load fails, as llama.cpp's.
        assert request(url + "/models/load", {"model": "gamma"})[0] == 200
        wait_for(lambda: status()["gamma"].get("failed") is True, "gamma's load to fail")
        assert status()["gamma"]["exit_code"] == 1
        assert sorted(p.used for p in gpu.read().processes) == sorted(held.values())
    finally:
        proc.kill()
        proc.wait(10)
