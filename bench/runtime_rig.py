"""One simulated host with every runtime the gate fronts, and three ways to reach each.

`gpugate sim run` starts a 24 GiB card with a simulated Ollama (one model, preloaded), a
simulated ComfyUI (the SD1.5 checkpoint) and a simulated llama-server in router mode
(one tiny GGUF model, sized on the card as a 1 GiB one). `gpugate serve` fronts the three
and runs a simulated whisper-server as its child (always warm), as `gpugate demo` does.
A bare pass-through (bench/passthrough.py, asyncio's loop, the floor of the request-rate
tables) fronts each of the four upstreams as well.

The gate and the pass-throughs run on the proxy's core; the host, whisper-server and the
client on the other (bench/targets.py).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
import urllib.request
from pathlib import Path

import attrs
import yaml

from bench.targets import LOAD_CPU, PROXY_CPU, start, wait_http
from gpugate.core.units import GiB, MiB
from gpugate_sim.hostprocess import SimulatedHostProcess
from gpugate_sim.llamaserver.memory import CUDA_CONTEXT, plan
from gpugate_sim.llamaserver.model import load_model_info, with_weights
from gpugate_sim.serverprocess import child_env
from gpugate_sim.whisper import WhisperServerSpec, whisper_argv
from tests.gate.harness import free_ports
from tests.llamaserver.gguf_models import write_models_dir

RUNTIMES = ("ollama", "comfyui", "llama", "whisper")
OLLAMA_MODEL = "llama3.2:3b"
LLAMA_MODEL = "alpha"
LLAMA_WEIGHTS = GiB
WHISPER_MODEL = "models/ggml-large-v3-turbo.bin"
SD15 = "v1-5-pruned-emaonly-fp16.safetensors"
FLUX_FILES = {
    "diffusion_models": {"flux1-dev-fp8.safetensors": "300MiB"},
    "text_encoders": {"t5xxl_fp8_e4m3fn.safetensors": "120MiB", "clip_l.safetensors": "20MiB"},
    "vae": {"ae.safetensors": "30MiB"},
}
"""FLUX.1-dev's files by the names its graph loads them, sized small: the gate reads and
validates the graph as it would the real one, while the job fits beside the other runtimes'
models (the 17 GiB of the real files would have the gate evict them between rows)."""
TOKENS_PER_SECOND = 2000
"""Both language runtimes: a token every half millisecond, so a stream's first token is
mostly the path to it."""


@attrs.frozen
class Paths:
    """Where each runtime is reached: directly, through the bare pass-through, the gate."""

    direct: dict[str, str]
    bare: dict[str, str]
    gate: dict[str, str]
    control: str
    pids: dict[str, int] = attrs.field(factory=dict)
    """The gate's process ("gate") and each runtime's bare pass-through (its name)."""

    def of(self, path: str) -> dict[str, str]:
        """Runtime → URL for one path: "direct", "bare" or "gate"."""
        return {"direct": self.direct, "bare": self.bare, "gate": self.gate}[path]


def llama_bytes(path: Path) -> int:
    """What the simulated router's child holds for the model: the weights given, then the
    KV cache and compute buffer its GGUF header implies (all layers, its whole context),
    and its CUDA context."""
    info = with_weights(load_model_info(path), LLAMA_WEIGHTS)
    return plan(info, info.n_ctx_train, info.n_layer + 1).total + CUDA_CONTEXT


def host_yaml(models: Path, ports: dict[str, int]) -> str:
    host = {
        "gpus": [{"name": "NVIDIA GeForce RTX 4090", "total": "24GiB", "reserved": "434MiB"}],
        "ollama": {
            "listen": f"127.0.0.1:{ports['ollama']}",
            "gpu": 0,
            "tokens_per_second": TOKENS_PER_SECOND,
            "models": [{"name": OLLAMA_MODEL, "size": "3200MiB", "load_seconds": "100ms"}],
            "preload": [{"model": OLLAMA_MODEL, "keep_alive": "24h"}],
        },
        "comfyui": {
            "listen": f"127.0.0.1:{ports['comfyui']}",
            "gpu": 0,
            "context": "210MiB",
            "steps_per_second": 1000,
            "preview_method": "none",
            "models": {"checkpoints": {SD15: "2034MiB"}, **FLUX_FILES},
        },
        "llamaserver": {
            "listen": f"127.0.0.1:{ports['llama']}",
            "models_dir": str(models),
            "n_gpu_layers": "all",
            "models": {f"{LLAMA_MODEL}.gguf": LLAMA_WEIGHTS},
            "load_seconds": "100ms",
            "tokens_per_second": TOKENS_PER_SECOND,
        },
    }
    return yaml.safe_dump(host, sort_keys=False)


def whisper_spec(port: int) -> WhisperServerSpec:
    """A warm whisper-server: its model loaded at start, a transcription answered at once."""
    return WhisperServerSpec(
        listen=f"127.0.0.1:{port}",
        model=WHISPER_MODEL,
        models={WHISPER_MODEL: 2050 * MiB},
        load_seconds=0.1,
        keepalive_timeout=30.0,
    )


def _flux_files() -> str:
    """FLUX_FILES as the comfyui consumer's `files:` lines (indented for consumers_yaml)."""
    pairs = [f"{name}: {size}" for folder in FLUX_FILES.values() for name, size in folder.items()]
    return "\n              ".join(pairs)


def consumers_yaml(
    control: int, listen: dict[str, int], upstream: dict[str, int], llama: int, whisper: list[str]
) -> str:
    """The gate in front of all four, each model known with its bytes."""
    return textwrap.dedent(f"""\
        gate:
          control: 127.0.0.1:{control}
          shutdown_grace: 2s
        budget:
          reserve: 1GiB
          reserve_max: 1GiB
        consumers:
          ollama:
            runtime: ollama
            listen: 127.0.0.1:{listen["ollama"]}
            upstream: http://127.0.0.1:{upstream["ollama"]}
            class: interactive
            residency: {{policy: keep_warm, ttl: 15m}}
            processes: {{commands: ["ollama serve"]}}
            models:
              {OLLAMA_MODEL}: {{envelope: 3200MiB}}
          comfyui:
            runtime: comfyui
            listen: 127.0.0.1:{listen["comfyui"]}
            upstream: http://127.0.0.1:{upstream["comfyui"]}
            class: interactive
            residency: {{policy: keep_warm, ttl: 15m}}
            processes: {{commands: ["ComfyUI/main.py"]}}
            working_set: 0
            working_set_per_megapixel: 1GiB
            files:
              {SD15}: 2034MiB
              {_flux_files()}
          llama:
            runtime: llama-server
            listen: 127.0.0.1:{listen["llama"]}
            upstream: http://127.0.0.1:{upstream["llama"]}
            class: interactive
            residency: {{policy: keep_warm, ttl: 15m}}
            processes: {{commands: ["llama-server --models-dir"]}}
            models:
              {LLAMA_MODEL}: {{envelope: "{llama}"}}
          whisper:
            runtime: whisper
            listen: 127.0.0.1:{listen["whisper"]}
            upstream: http://127.0.0.1:{upstream["whisper"]}
            class: interactive
            envelope: 2050MiB
            residency: {{policy: always_warm}}
            processes: {{commands: ["whisper-server"]}}
            control:
              command: {json.dumps(whisper)}
              env: {{PYTHONPATH: {json.dumps(child_env({})["PYTHONPATH"])}}}
              start_timeout: 30s
        """)


def start_front(
    processes: list[subprocess.Popen[bytes]],
    config: Path,
    env: dict[str, str],
    log: Path,
    ports: dict[str, dict[str, int]],
    control: int,
) -> Paths:
    """Start the gate on `config` (its stderr to `log`) and a bare pass-through in front of
    each upstream, all on the proxy's core, adding them to `processes`; the three ways to
    each runtime (`ports`: "direct", "bare" and "gate", runtime → port), once the gate's
    health answers."""
    gate = start(
        [sys.executable, "-m", "gpugate", "serve", "--config", str(config)], PROXY_CPU, env, log
    )
    processes.append(gate)
    pids = {"gate": gate.pid}
    for name, port in ports["bare"].items():
        argv = [sys.executable, "-m", "bench.passthrough", "--port", str(port)]
        argv += ["--upstream", f"http://127.0.0.1:{ports['direct'][name]}"]
        processes.append(start(argv, PROXY_CPU))
        pids[name] = processes[-1].pid
    urls = {
        path: {name: f"http://127.0.0.1:{port}" for name, port in ports[path].items()}
        for path in ("direct", "bare", "gate")
    }
    paths = Paths(urls["direct"], urls["bare"], urls["gate"], f"http://127.0.0.1:{control}", pids)
    wait_http(paths.control + "/gate/v1/health")
    return paths


def stop_all(processes: list[subprocess.Popen[bytes]]) -> None:
    """Ask every process to stop, then wait for each (a gate stops the servers it started)."""
    for process in processes:
        process.terminate()
    for process in processes:
        process.wait(timeout=30)
    processes.clear()


@attrs.define
class RuntimeRig:
    """The host, the gate and the pass-throughs; `stop` ends every process it started."""

    tmp: Path
    host: SimulatedHostProcess | None = None
    processes: list[subprocess.Popen[bytes]] = attrs.field(factory=list)

    def start(self) -> Paths:
        """Start everything and wait until each path answers."""
        names = RUNTIMES
        ports = free_ports(3 * len(names) + 1)
        direct = dict(zip(names, ports[0:4], strict=True))
        listen = dict(zip(names, ports[4:8], strict=True))
        bare = dict(zip(names, ports[8:12], strict=True))
        control = ports[12]
        models = self.tmp / "models"
        (model,) = write_models_dir(models, [LLAMA_MODEL])
        host_file = self.tmp / "host.yaml"
        host_file.write_text(host_yaml(models, direct))
        state = self.tmp / "state"
        # The host, its runtimes and whisper-server inherit the load generator's core.
        pinned = os.sched_getaffinity(0)
        os.sched_setaffinity(0, {LOAD_CPU})
        try:
            self.host = SimulatedHostProcess(host_file, state).start()
        finally:
            os.sched_setaffinity(0, pinned)
        assert self.host.environment is not None
        env = {**self.host.environment.apply(), "GPUGATE_LOG_LEVEL": "WARNING"}
        # whisper-server is the gate's child: without taskset it would share the proxy's core.
        whisper = ["taskset", "-c", str(LOAD_CPU)]
        whisper += whisper_argv(whisper_spec(direct["whisper"]), state)
        config = self.tmp / "consumers.yaml"
        config.write_text(consumers_yaml(control, listen, direct, llama_bytes(model), whisper))
        ports = {"direct": direct, "bare": bare, "gate": listen}
        paths = start_front(self.processes, config, env, self.tmp / "gate.log", ports, control)
        self._wait_whisper_up(paths.control)
        for target in (paths.direct, paths.bare, paths.gate):
            wait_http(target["ollama"] + "/api/version")
            wait_http(target["comfyui"] + "/system_stats")
            wait_http(target["llama"] + "/health")
            wait_http(target["whisper"] + "/health")
        return paths

    def _wait_whisper_up(self, control: str, timeout: float = 60.0) -> None:
        """Until the gate lists whisper-server as a resident: started and answering."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with urllib.request.urlopen(control + "/gate/v1/status") as resp:
                residents = json.load(resp)["residents"]
            if any(r["consumer"] == "whisper" and r["state"] == "resident" for r in residents):
                return
            time.sleep(0.1)
        raise RuntimeError(f"the gate never started whisper-server; see {self.tmp / 'gate.log'}")

    def stop(self) -> None:
        """Stop the proxies (the gate stops its whisper-server), then the host."""
        stop_all(self.processes)
        if self.host is not None:
            self.host.stop()
            self.host = None
