"""The gate in front of a simulated ComfyUI and a simulated Ollama, in one event loop."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import attrs

from gpugate.core.effects import Event, EventKind
from gpugate.gate.gate import Gate
from gpugate.runtimes.sections import load_config_text
from gpugate_sim.comfyui import SimComfyUI
from gpugate_sim.device import SimulatedGpuHost
from gpugate_sim.ollama.server import SimOllama
from gpugate_sim.scenario import ComfyUISpec, OllamaSpec
from tests.gate.harness import MODELS
from tests.ports import free_ports
from tests.serving import serving
from tests.sim.comfyui_helpers import MODELS as COMFY_MODELS

CONFIG = """\
gate:
  control: 127.0.0.1:{control}
  shutdown_grace: 2s
  nvml_library: {library}
  database: {database}
budget:
  reserve: 1GiB
  reserve_max: 1GiB
  sample_interval: 100ms
  stale_after: 5s
  reclaim_timeout: 5s
consumers:
  ollama:
    runtime: ollama
    listen: 127.0.0.1:{ollama_listen}
    upstream: {ollama}
    class: background
    residency: {{policy: keep_warm, ttl: 15m}}
    processes: {{commands: [llama-server], names: [llama-server]}}
    models:
      gemma3:12b: {{envelope: 7796MiB, class: production}}
      bge-m3: {{envelope: 2012MiB}}
      qwen2.5:7b: {{envelope: 5700MiB, class: interactive}}
  comfyui:
    runtime: comfyui
    listen: 127.0.0.1:{comfy_listen}
    upstream: {comfy}
    class: interactive
    residency: {{policy: keep_warm, ttl: 15m}}
    processes: {{commands: [ComfyUI/main.py]}}
    working_set: 0
    working_set_per_megapixel: 1GiB
{more}    files:
      v1-5-pruned-emaonly-fp16.safetensors: 2034MiB
      flux1-dev-fp8.safetensors: 11350MiB
      t5xxl_fp8_e4m3fn.safetensors: 4667MiB
      clip_l.safetensors: 235MiB
      ae.safetensors: 320MiB
"""


@attrs.define
class ComfyStack:
    gate: Gate
    comfy: SimComfyUI
    ollama: SimOllama
    gate_comfy: str
    gate_ollama: str
    direct_comfy: str

    def next_event(self, kind: EventKind, **match: object) -> asyncio.Future[Event]:
        def wanted(event: Event) -> bool:
            return event.kind is kind and all(getattr(event, k) == v for k, v in match.items())

        return self.gate.events.next(wanted)


@contextlib.asynccontextmanager
async def comfy_stack(
    tmp_path: Path,
    host: SimulatedGpuHost,
    library: Path,
    *,
    more: str = "",
    **comfy_fields: object,
) -> AsyncIterator[ComfyStack]:
    """The gate (`serve`) in front of both simulated runtimes; ComfyUI fast by default."""
    ollama = SimOllama(OllamaSpec(listen="127.0.0.1:0", keep_alive="5m", models=MODELS), host)
    ollama_url = await ollama.start()
    comfy_fields.setdefault("models", COMFY_MODELS)
    comfy_fields.setdefault("steps_per_second", 200.0)
    comfy = SimComfyUI(ComfyUISpec(**comfy_fields), host)  # type: ignore[arg-type]
    await comfy.start("127.0.0.1", 0)
    assert comfy.url is not None
    control, ollama_listen, comfy_listen = free_ports(3)
    text = CONFIG.format(
        control=control,
        library=library,
        database=tmp_path / "gpugate.db",
        ollama_listen=ollama_listen,
        ollama=ollama_url,
        comfy_listen=comfy_listen,
        comfy=comfy.url,
        more=more,
    )
    config = load_config_text(text, tmp_path / "consumers.yaml")
    try:
        async with serving(config) as served:
            yield ComfyStack(
                served.gate,
                comfy,
                ollama,
                f"http://127.0.0.1:{comfy_listen}",
                f"http://127.0.0.1:{ollama_listen}",
                comfy.url,
            )
    finally:
        await comfy.close()
        await ollama.close()
