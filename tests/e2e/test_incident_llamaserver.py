"""The incident again, across runtimes: llama-server's router, Ollama and ComfyUI on one card.

`gpugate sim run` starts a host with the incident's 16 GiB card, its Ollama and its ComfyUI,
and a simulated llama-server in router mode (`--models-dir`, `-ngl all`) over two tiny GGUF
models that the host file sizes for the card (`models:`, the simulator's
`--sim-model-size`): alpha 4 GiB of weights, beta 3 GiB. Clients speak only to public
ports. The same sequence twice:

1. bge-m3 on Ollama (production), a chat with alpha and one with beta (background),
   then a FLUX render on ComfyUI (interactive).
2. Straight at the runtimes, the render runs with only part of its UNet on the card
   (ComfyUI's partial load; no OOM on the simulated device).
3. Through `gpugate serve`, the render succeeds with no OOM: the gate evicts both idle
   llama-server models (a lower class than the render) with `POST /models/unload` and
   keeps bge-m3 (a higher class). Its events say what went, for which job, and
   the bytes before and after; the router lists both models `unloaded`; no lease is left.

The card (MiB): 16,384 − 434 driver − 210 ComfyUI idle − 2,012 bge-m3 − 4,097 alpha
− 3,073 beta leaves 6,558 free: the text encoders (4,902) fit, the UNet with its working
set (12,374) does not. Through the gate, with its 1 GiB reserve, 5,534 MiB are schedulable
before; once alpha and beta are gone, 12,704: what the render is leased (the sum of its
files capped at what the card can give it). bge-m3 is production and stays.
"""

from __future__ import annotations

import asyncio
import json
import textwrap
import time
from pathlib import Path
from typing import Any

import aiohttp
import attrs
import pytest
import yaml

from gpugate.core.units import GiB, MiB
from gpugate_sim.llamaserver.memory import CUDA_CONTEXT, plan
from gpugate_sim.llamaserver.model import load_model_info, with_weights
from tests.clihost import HostProcess, running_gate, running_host
from tests.e2e.test_incident_comfyui import (
    INCIDENT,
    connect,
    outcome,
    partly_loaded_then_freed,
    until_no_lease,
)
from tests.ports import free_ports
from tests.sim.comfyui_helpers import flux

gguf_models = pytest.importorskip("tests.llamaserver.gguf_models")

pytestmark = pytest.mark.e2e

WEIGHTS = {"alpha": 4 * GiB, "beta": 3 * GiB}
"""The llama-server models' weights on the simulated card (`--sim-model-size`)."""
WAIT = 20.0
FLUX_FLOOR = (11350 + 1024) * MiB
"""The least the render runs in: its largest stage (the UNet) and 1 GiB per megapixel."""
BGE_M3 = 1_695_784_960
"""What bge-m3's runner holds: its llama-server's buffers and CUDA context (its shape in
the incident's host file)."""
FLUX_CEILING = (16384 - 434 - 1024 - 210) * MiB - BGE_M3
"""The most the card can give it: less the driver, the reserve, ComfyUI's idle context and
bge-m3 (production: the render may not evict it). The job is leased the sum of its files
capped at this, never below the floor."""


def held_bytes(path: Path, weights: int) -> int:
    """What the simulated child of a model holds once loaded: the given weights, then
    the KV cache and compute buffer of its GGUF header (the whole context, all layers),
    and its CUDA context."""
    info = with_weights(load_model_info(path), weights)
    return plan(info, info.n_ctx_train, info.n_layer + 1).total + CUDA_CONTEXT


def host_yaml(models: Path, ollama: int, comfy: int, llama: int) -> str:
    """The incident's card, Ollama and ComfyUI (no whisper, no mVoice, no preloads), and
    a llama-server router over `models`."""
    data = yaml.safe_load(INCIDENT.read_text())
    host = {key: data[key] for key in ("driver", "cuda", "gpus", "ollama", "comfyui")}
    host["ollama"] = {"listen": f"127.0.0.1:{ollama}", "models": data["ollama"]["models"]}
    host["comfyui"] = {**data["comfyui"], "listen": f"127.0.0.1:{comfy}"}
    host["llamaserver"] = {
        "listen": f"127.0.0.1:{llama}",
        "models_dir": str(models),
        "n_gpu_layers": "all",
        "models": {f"{name}.gguf": size for name, size in WEIGHTS.items()},
        "load_seconds": "300ms",
    }
    return yaml.safe_dump(host, sort_keys=False)


def consumers_yaml(control: int, ports: dict[str, tuple[int, int]], envelopes: dict) -> str:
    """The gate in front of all three; alpha and beta a class below the render, each with
    the bytes the simulator takes for it (the gate's GGUF estimate knows only the tiny
    file)."""
    (go, o), (gc, c), (gl, ll) = ports["ollama"], ports["comfyui"], ports["llama"]
    return textwrap.dedent(f"""\
        gate:
          control: 127.0.0.1:{control}
          shutdown_grace: 2s
        budget:
          reserve: 1GiB
          reserve_max: 1GiB
          sample_interval: 100ms
          reclaim_timeout: 10s
        consumers:
          ollama:
            runtime: ollama
            listen: 127.0.0.1:{go}
            upstream: http://127.0.0.1:{o}
            class: interactive
            residency: {{policy: keep_warm, ttl: 15m}}
            processes: {{commands: ["ollama serve"]}}
            models:
              bge-m3: {{class: production, envelope: 2012MiB}}
          comfyui:
            runtime: comfyui
            listen: 127.0.0.1:{gc}
            upstream: http://127.0.0.1:{c}
            class: interactive
            residency: {{policy: keep_warm, ttl: 15m}}
            processes: {{commands: ["ComfyUI/main.py"]}}
            working_set: 0
            working_set_per_megapixel: 1GiB
            files:
              flux1-dev-fp8.safetensors: 11350MiB
              t5xxl_fp8_e4m3fn.safetensors: 4667MiB
              clip_l.safetensors: 235MiB
              ae.safetensors: 320MiB
          llama:
            runtime: llama-server
            listen: 127.0.0.1:{gl}
            upstream: http://127.0.0.1:{ll}
            class: interactive
            residency: {{policy: keep_warm, ttl: 15m}}
            processes: {{commands: ["llama-server --models-dir"]}}
            models:
              alpha: {{class: background, envelope: "{envelopes["alpha"]}"}}
              beta: {{class: background, envelope: "{envelopes["beta"]}"}}
        """)


async def post_ok(session: aiohttp.ClientSession, url: str, body: dict) -> Any:
    async with session.post(url, json=body) as resp:
        assert resp.status == 200, (url, resp.status, await resp.text())
        return await resp.json(content_type=None)


async def sequence(
    session: aiohttp.ClientSession, urls: dict[str, str], client: str
) -> dict[str, Any]:
    """bge-m3, a chat with alpha and with beta, then FLUX: the render's last event."""
    ollama, llama, comfy = urls["ollama"], urls["llama"], urls["comfyui"]
    await post_ok(session, ollama + "/api/embed",
                  {"model": "bge-m3", "input": "x", "keep_alive": "24h"})  # fmt: skip
    for name in WEIGHTS:
        chat = {"model": name, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
        answer = await post_ok(session, llama + "/v1/chat/completions", chat)
        assert answer["model"] == name and answer["usage"]["completion_tokens"] == 1
    socket = await connect(session, comfy, client)
    try:
        _, events = await socket.run(session, comfy, flux(), client)
    finally:
        await socket.ws.close()
    return outcome(events)


async def router_status(session: aiohttp.ClientSession, llama: str) -> dict[str, dict]:
    """The router's own listing: each model's `status`."""
    async with session.get(llama + "/models") as resp:
        assert resp.status == 200
        return {m["id"]: m["status"] for m in (await resp.json(content_type=None))["data"]}


def words(pid: int) -> list[str]:
    """/proc/PID/cmdline's words ([] once the process is gone)."""
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return [w.decode() for w in raw.split(b"\0") if w]


def llama_holders(host: HostProcess) -> dict[int, int]:
    """PID → bytes of the router's children on the simulated card (an Ollama runner also
    shows as `llama-server`, but without `--alias`)."""
    held = {p.pid: p.used for p in host.gpu.read().processes if p.name == "llama-server"}
    return {pid: used for pid, used in held.items() if "--alias" in words(pid)}


def wait_until(condition: Any, what: str) -> None:
    deadline = time.monotonic() + WAIT
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


@attrs.define
class Stack:
    """The files and ports of one run: the host, the gate's configuration, the URLs."""

    host_file: Path
    config: Path
    held: dict[str, int]
    direct: dict[str, str]
    gated: dict[str, str]
    ollama_port: int
    gate_ollama: int
    control: int


@pytest.fixture
def stack(tmp_path: Path) -> Stack:
    ollama, comfy, llama, gate_ollama, gate_comfy, gate_llama, control = free_ports(7)
    models = tmp_path / "models"
    paths = gguf_models.write_models_dir(models, list(WEIGHTS))
    held = {p.stem: held_bytes(p, WEIGHTS[p.stem]) for p in paths}
    host_file = tmp_path / "host.yaml"
    host_file.write_text(host_yaml(models, ollama, comfy, llama))
    config = tmp_path / "consumers.yaml"
    ports = {"ollama": (gate_ollama, ollama), "comfyui": (gate_comfy, comfy),
             "llama": (gate_llama, llama)}  # fmt: skip
    config.write_text(consumers_yaml(control, ports, held))
    direct = {name: f"http://127.0.0.1:{port}" for name, port in
              (("ollama", ollama), ("comfyui", comfy), ("llama", llama))}  # fmt: skip
    gated = {name: f"http://127.0.0.1:{port}" for name, port in
             (("ollama", gate_ollama), ("comfyui", gate_comfy), ("llama", gate_llama))}  # fmt: skip
    return Stack(host_file, config, held, direct, gated, ollama, gate_ollama, control)


async def test_the_render_evicts_llama_server_models_through_the_gate(
    stack: Stack, tmp_path: Path
) -> None:
    started = time.monotonic()
    held, direct, gated = stack.held, stack.direct, stack.gated
    host_file, config, ollama = stack.host_file, stack.config, stack.ollama_port
    gate_ollama, control = stack.gate_ollama, stack.control

    with running_host(host_file, tmp_path / "state", ollama) as host:
        async with aiohttp.ClientSession() as session:
            # Before the gate: straight at the runtimes.
            slow = await sequence(session, direct, client="before")
            assert slow["type"] == "execution_success", slow
            straight_ooms = host.gpu.ooms()
            assert straight_ooms == []
            await partly_loaded_then_freed(session, direct["comfyui"])
            # The children held what the host file sized, and show as llama-server
            # (`comm` and the first word of their command line).
            children = llama_holders(host)
            assert sorted(children.values()) == sorted(held.values())
            for pid in children:
                assert Path(f"/proc/{pid}/comm").read_text().strip() == "llama-server"
                assert words(pid)[:2] == ["llama-server", "--host"]
            # Ollama's runner is named llama-server too (as Ollama >= 0.30 starts it): a
            # rule `commands: [llama-server]` would claim it for the router's consumer, as
            # a process's own command line is matched before its parent's ("ollama
            # serve"). The router's consumer names the router instead (below).
            [runner] = [p.pid for p in host.gpu.read().processes if p.pid not in children
                        and p.name == "llama-server"]  # fmt: skip
            assert "llama-server" in words(runner) and "--alias" not in words(runner)
            [router] = {Path(f"/proc/{pid}/stat").read_text().split()[3] for pid in children}
            assert words(int(router))[:2] == ["llama-server", "--models-dir"]
            # A fresh start for the llama-server models: the router unloads them.
            for name in WEIGHTS:
                await post_ok(session, direct["llama"] + "/models/unload", {"model": name})
            wait_until(lambda: not llama_holders(host), "the router's children to exit")

            with running_gate(config, host.env(), gate_ollama, control) as gate:
                done = await sequence(session, gated, client="after")
                assert done["type"] == "execution_success", done
                status = await until_no_lease(gate)
                log = await gate.events()
                listed = await router_status(session, direct["llama"])
            gated_ooms = host.gpu.ooms()[len(straight_ooms) :]
    assert gated_ooms == [], "an OOM through the gate"
    elapsed = time.monotonic() - started

    # What the gate evicted, why, for which request, and the bytes before and after.
    evicting = [e for e in log if e["event"] == "eviction_started"]
    evicted = [e for e in log if e["event"] == "eviction_done"]
    assert {(e["consumer"], e["model"]) for e in evicting} == {("llama", n) for n in WEIGHTS}
    assert {(e["consumer"], e["model"]) for e in evicted} == {("llama", n) for n in WEIGHTS}
    [queued] = [e for e in log if e["event"] == "ticket_queued" and e["consumer"] == "comfyui"]
    assert FLUX_FLOOR <= queued["bytes"] <= FLUX_CEILING, queued
    for event in evicting:
        assert event["reason"] == "eviction"
        assert event["bytes"] == held[event["model"]], event
        assert event["detail"].startswith("for comfyui/job-")
        assert event["schedulable_before"] < queued["bytes"]
    for event in evicted:
        assert event["reason"] == "eviction"
        assert event["bytes"] == held[event["model"]], event
        assert event["detail"].startswith("reclaimed; ")
    afters = sorted(e["schedulable_after"] for e in evicted)
    assert afters[-1] >= queued["bytes"]
    freed = afters[-1] - evicting[0]["schedulable_before"]
    assert freed >= 0.9 * sum(held.values()), (freed, evicting, evicted)
    # Each model's load was leased for its envelope, before anything was evicted.
    grants = [e for e in log if e["event"] == "lease_granted" and e["consumer"] == "llama"]
    assert {e["model"]: e["bytes"] for e in grants} == held and len(grants) == len(held)
    assert max(log.index(e) for e in grants) < log.index(evicting[0])
    # The router's own word: both models unloaded, neither failed.
    assert {m: (s["value"], s.get("failed", False)) for m, s in listed.items()} == {
        m: ("unloaded", False) for m in WEIGHTS
    }
    assert status["leases"] == [] and status.get("waiting", []) == []
    residents = {(r["consumer"], r["model"]) for r in status["residents"]}
    assert ("ollama", "bge-m3:latest") in residents
    assert not any(consumer == "llama" for consumer, _ in residents)
    print(json.dumps({
        "held": held, "straight_ooms": len(straight_ooms), "gated_ooms": len(gated_ooms),
        "schedulable_before": evicting[0]["schedulable_before"], "after": afters,
        "seconds": round(elapsed, 1),
    }))  # fmt: skip


async def listed_after(gate: Any, moment: float) -> float:
    """Wait (bounded) until the gate finished a listing of `llama` after `moment`
    (time.monotonic()); when it finished."""
    deadline = time.monotonic() + WAIT
    while True:
        health = await gate.get_json("/gate/v1/health")
        [check] = [c for c in health["checks"] if c.get("consumer") == "llama"]
        now = time.monotonic()
        if check["age_seconds"] is not None and now - check["age_seconds"] > moment:
            return now - check["age_seconds"]
        assert now < deadline, f"no listing of llama after {moment}: {check}"
        await asyncio.sleep(0.05)


async def test_a_listing_keeps_the_envelope_of_a_loaded_llama_server_model(stack: Stack) -> None:
    """A llama-server model loaded through the gate keeps its envelope's bytes once the
    gate has listed the router: what it would free if evicted. The GGUF header of the tiny
    file says about 257 MiB (a 256 MiB CUDA context, the rest its tensors, cache and
    buffer); NVML shows the 4 GiB the envelope says."""
    state = stack.host_file.parent / "state"
    with (
        running_host(stack.host_file, state, stack.ollama_port) as host,
        running_gate(stack.config, host.env(), stack.gate_ollama, stack.control) as gate,
    ):
        async with aiohttp.ClientSession() as session:
            chat = {"model": "alpha", "messages": [{"role": "user", "content": "hi"}],
                    "max_tokens": 1}  # fmt: skip
            await post_ok(session, stack.gated["llama"] + "/v1/chat/completions", chat)
        loaded = time.monotonic()
        # Two listings: the second was asked after the first ended, after the load.
        await listed_after(gate, await listed_after(gate, loaded))
        status = await gate.status()
    consumer = status["gpus"][0]["consumers"]["llama"]
    assert consumer["observed"] == stack.held["alpha"]
    [alpha] = [r for r in status["residents"] if r["consumer"] == "llama"]
    assert (alpha["model"], alpha["bytes"]) == ("alpha", stack.held["alpha"]), (alpha, consumer)
    assert consumer["unexplained"] == 0
