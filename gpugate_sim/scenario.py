"""A simulated host described in YAML (HOST.yaml): GPUs, holder processes, fake runtimes.

gpus:
  - name: NVIDIA GeForce RTX 4080
    total: 16GiB
    reserved: 434MiB          # driver/firmware reserved (NVML v2 `reserved`)
    base_used: 0              # used memory no process accounts for
holders:                      # processes that hold VRAM, like Plex or whisper-server
  - name: Plex Transcoder     # process name (comm, cut to 15 characters) and cmdline
    command: ["/usr/lib/plexmediaserver/Plex Transcoder", "-codec:0", "hevc"]
    bytes: 1.5GiB
    gpu: 0
    children: []              # holders started as this one's children
    pulse_period: 2s          # optional: hold pulse_bytes more for 2 s, rest 2 s, repeat
    pulse_bytes: 1GiB
ollama:                       # a simulated Ollama (gpugate_sim.ollama.spec)
  listen: 127.0.0.1:11435
  gpus: [0, 1]                # the GPUs it sees (or gpu: N; neither: all of them)
  ...
whisper:                      # a simulated whisper.cpp whisper-server (gpugate_sim.whisper)
  listen: 127.0.0.1:8081
  model: models/ggml-large-v3-turbo.bin
  models: {models/ggml-large-v3-turbo.bin: 2050MiB}   # model file -> VRAM once loaded
  load_seconds: 1s
  record: whisper.jsonl       # optional: a JSON line per /load and /inference answered
vllm:                         # a simulated `vllm serve` (gpugate_sim.vllm)
  listen: 127.0.0.1:8000
  model: Qwen/Qwen3-0.6B
  gpu_memory_utilization: 0.5 # takes this fraction of the card's total memory at start
  enable_sleep_mode: true
  dev_mode: true              # VLLM_SERVER_DEV_MODE=1: POST /sleep, /wake_up, GET /is_sleeping
  weights: 1200MiB
llamaserver:                  # a simulated llama.cpp llama-server (gpugate_sim.llamaserver)
  listen: 127.0.0.1:8082
  models_dir: models/llama    # router mode; or model: FILE.gguf for one model
comfyui:                      # a simulated ComfyUI (see gpugate_sim.comfyui)
  listen: 127.0.0.1:8188
  record: prompts.jsonl       # optional: a JSON line per POST /prompt answered
  reserve_vram: 1             # optional: --reserve-vram GB (400 MiB without it)
  dynamic_vram: false         # optional: --enable-dynamic-vram
  models:                     # model files by folder, with the VRAM their weights take
    checkpoints: {v1-5-pruned-emaonly-fp16.safetensors: 2034MiB}
  ...
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import attrs
import yaml

from gpugate.core.units import GiB, MiB, parse_duration
from gpugate_sim.ollama.spec import OllamaModelSpec, OllamaSpec, PreloadSpec, parse_ollama
from gpugate_sim.specfields import duration as _duration
from gpugate_sim.specfields import field_size as _field_size
from gpugate_sim.specfields import number as _number
from gpugate_sim.specfields import only as _only
from gpugate_sim.specfields import record_path

__all__ = [
    "ComfyModelFile",
    "ComfyUISpec",
    "GpuSpec",
    "HolderSpec",
    "HostSpec",
    "OllamaModelSpec",
    "OllamaSpec",
    "PreloadSpec",
    "ScenarioError",
    "load_host",
]

if TYPE_CHECKING:
    from gpugate_sim.llamaserver.spec import LlamaServerSpec
    from gpugate_sim.vllm.spec import VllmServerSpec
    from gpugate_sim.whisper.spec import WhisperServerSpec


@attrs.frozen
class GpuSpec:
    name: str = "NVIDIA GeForce RTX 4080"
    total: int = 16 * GiB
    reserved: int = 0
    base_used: int = 0
    uuid: str | None = None


@attrs.frozen
class HolderSpec:
    """A process that holds `bytes` of VRAM from start to exit."""

    name: str
    bytes: int = 0
    gpu: int = 0
    command: tuple[str, ...] = ()
    kind: str = "C"
    children: tuple[HolderSpec, ...] = ()
    pulse_period: float | None = None
    """Seconds `pulse_bytes` more are held, then as many seconds without (Plex transcodes)."""
    pulse_bytes: int = 0


@attrs.frozen
class ComfyModelFile:
    """A model file the simulated ComfyUI has under models/FOLDER."""

    folder: str
    name: str
    size: int
    """Bytes on disk, and the VRAM its weights take once on the GPU."""


@attrs.frozen
class ComfyUISpec:
    """A simulated ComfyUI: one Python process holding its own VRAM (gpugate_sim.comfyui)."""

    listen: str = "127.0.0.1:8188"
    gpu: int | None = None
    """`--cuda-device N`: ComfyUI sets CUDA_VISIBLE_DEVICES=N itself. None: not given, so
    the CUDA_VISIBLE_DEVICES it inherits decides (GPU 0 without one)."""
    context: int = 210 * MiB
    """What the process holds while idle: the CUDA context and PyTorch's own allocations."""
    models: tuple[ComfyModelFile, ...] = ()
    steps_per_second: float = 50.0
    """KSampler speed."""
    node_seconds: float = 0.0
    """How long every other node that does work takes."""
    load_seconds_per_gib: float = 0.0
    """Time to move weights onto the GPU; VRAM fills over it."""
    sampler_bytes_per_megapixel: int = 1 * GiB
    """KSampler's working set per megapixel of latent image (times the batch size)."""
    enable_cors_header: str | None = None
    """--enable-cors-header ORIGIN: permissive CORS instead of the origin check."""
    max_upload_size: float = 100.0
    """--max-upload-size, in MB: the limit on every request body."""
    preview_method: str = "auto"
    """--preview-method: `none` sends no previews during sampling."""
    disable_smart_memory: bool = False
    """--disable-smart-memory: weights leave the GPU after every prompt."""
    reserve_vram: float | None = None
    """--reserve-vram GB: what ComfyUI leaves free for others in every load (× 1024³);
    None: 400 MiB, as on Linux (gpugate_sim.comfyui.memory)."""
    dynamic_vram: bool = False
    """--enable-dynamic-vram: weights fault into free VRAM as they are used and leave it
    under pressure (comfy-aimdo). Off: the 0.3.64 this simulates has no Dynamic VRAM (later
    ComfyUI turns it on by default on NVIDIA)."""
    vram_headroom: float = 0.0
    """--vram-headroom GB: free memory Dynamic VRAM keeps beyond its own 256 MiB."""
    offload_gib_per_second: float = 16.0
    """How fast weights a partial load left in CPU RAM are copied to the GPU, which every
    sampler step does (about a PCIe 4.0 x16 link)."""
    version: str = "0.3.64"
    record: Path | None = None
    """A file to which every `POST /prompt` answer is appended as a JSON line (a fuzzer's
    oracle: gpugate_sim.comfyui.record)."""
    custom_nodes: tuple[str, ...] = ()
    """Custom node packs it loads (gpugate_sim.comfyui.custom_pack: `checked_nodes`)."""


@attrs.frozen
class HostSpec:
    source: Path | None = None
    driver: str = "550.54.15"
    cuda: int = 12040
    gpus: tuple[GpuSpec, ...] = (GpuSpec(),)
    holders: tuple[HolderSpec, ...] = ()
    ollama: OllamaSpec | None = None
    whisper: WhisperServerSpec | None = None
    comfyui: ComfyUISpec | None = None
    vllm: VllmServerSpec | None = None
    llamaserver: LlamaServerSpec | None = None


class ScenarioError(ValueError):
    """A HOST.yaml that cannot be read; the message names the file and the field."""


def load_host(path: str | Path) -> HostSpec:
    """Read a HOST.yaml file."""
    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise ScenarioError(f"{path}: {exc}") from None
    try:
        return _host(data, path)
    except (KeyError, TypeError, ValueError) as exc:
        raise ScenarioError(f"{path}: {exc}") from None


def _host(data: dict[str, Any], path: Path) -> HostSpec:
    parts = {"ollama", "whisper", "comfyui", "vllm", "llamaserver"}
    _only(data, "host", {"driver", "cuda", "gpus", "holders"} | parts)
    gpus = tuple(_gpu(g, i) for i, g in enumerate(data.get("gpus") or [{}]))
    holders = tuple(_holder(h, f"holders[{i}]") for i, h in enumerate(data.get("holders") or []))
    for i, holder in enumerate(holders):
        _check_gpus(holder, f"holders[{i}]", len(gpus))
    ollama = parse_ollama(data["ollama"], path.parent) if data.get("ollama") is not None else None
    if ollama is not None:
        for i, gpu in enumerate(ollama.devices(len(gpus))):
            if gpu >= len(gpus):
                where = "ollama.gpu" if ollama.gpus is None else f"ollama.gpus[{i}]"
                raise ValueError(f"{where}: no GPU {gpu} (the host has {len(gpus)})")
    whisper = None
    if data.get("whisper") is not None:
        from gpugate_sim.whisper.spec import parse_whisper

        whisper = parse_whisper(data["whisper"], path.parent)
    if whisper is not None and whisper.gpu >= len(gpus):
        raise ValueError(f"whisper.gpu: no GPU {whisper.gpu} (the host has {len(gpus)})")
    vllm = None
    if data.get("vllm") is not None:
        from gpugate_sim.vllm.spec import parse_vllm

        vllm = parse_vllm(data["vllm"], path.parent)
        if vllm.gpu is not None and vllm.gpu >= len(gpus):
            raise ValueError(f"vllm.gpu: no GPU {vllm.gpu} (the host has {len(gpus)})")
    llamaserver = None
    if data.get("llamaserver") is not None:
        from gpugate_sim.llamaserver.spec import parse_llamaserver

        llamaserver = parse_llamaserver(data["llamaserver"], path.parent)
        if llamaserver.gpu is not None and llamaserver.gpu >= len(gpus):
            raise ValueError(
                f"llamaserver.gpu: no GPU {llamaserver.gpu} (the host has {len(gpus)})"
            )
    return HostSpec(
        source=path,
        driver=str(data.get("driver", "550.54.15")),
        cuda=_number(data, "cuda", "host", int, 12040, minimum=0),
        gpus=gpus,
        holders=holders,
        ollama=ollama,
        whisper=whisper,
        vllm=vllm,
        llamaserver=llamaserver,
        comfyui=_comfyui(data["comfyui"], len(gpus), path.parent)
        if data.get("comfyui") is not None
        else None,
    )


def _gpu(data: dict[str, Any], index: int) -> GpuSpec:
    _only(data, f"gpus[{index}]", {"name", "total", "reserved", "base_used", "uuid"})
    where = f"gpus[{index}]"
    uuid = data.get("uuid")
    if uuid is not None and (not isinstance(uuid, str) or len(uuid.split()) != 1):
        raise ValueError(f"{where}.uuid: expected one word like GPU-5f0e3a41-..., got {uuid!r}")
    return GpuSpec(
        name=str(data.get("name", GpuSpec.name)),
        total=_field_size(data, "total", where, 16 * GiB),
        reserved=_field_size(data, "reserved", where, 0),
        base_used=_field_size(data, "base_used", where, 0),
        uuid=uuid,
    )


def _holder(data: dict[str, Any], where: str) -> HolderSpec:
    keys = {"name", "bytes", "gpu", "command", "kind", "children", "pulse_period", "pulse_bytes"}
    _only(data, where, keys)
    name = data.get("name")
    if not isinstance(name, str) or not name.strip():
        raise ValueError(f"{where}.name: required, a non-empty string")
    kind = str(data.get("kind", "C"))
    if kind not in ("C", "G", "CG"):
        raise ValueError(f"{where}.kind: expected C, G or CG, got {kind!r}")
    command = data.get("command") or []
    if not isinstance(command, list) or not all(isinstance(c, str | int | float) for c in command):
        raise ValueError(f"{where}.command: expected a list of words, got {command!r}")
    children = data.get("children") or []
    if not isinstance(children, list):
        raise ValueError(f"{where}.children: expected a list of holders")
    pulse_period = data.get("pulse_period")
    if pulse_period is not None:
        try:
            pulse_period = parse_duration(pulse_period)
        except ValueError as exc:
            raise ValueError(f"{where}.pulse_period: {exc}") from None
        if pulse_period <= 0:
            raise ValueError(f"{where}.pulse_period: must be positive")
    pulse_bytes = _field_size(data, "pulse_bytes", where, 0)
    if (pulse_period is None) != (pulse_bytes == 0):
        raise ValueError(f"{where}: pulse_period and pulse_bytes go together")
    return HolderSpec(
        name=name,
        bytes=_field_size(data, "bytes", where, 0),
        gpu=_number(data, "gpu", where, int, 0, minimum=0),
        command=tuple(str(c) for c in command),
        kind=kind,
        children=tuple(_holder(c, f"{where}.children[{i}]") for i, c in enumerate(children)),
        pulse_period=pulse_period,
        pulse_bytes=pulse_bytes,
    )


def _check_gpus(holder: HolderSpec, where: str, count: int) -> None:
    if holder.gpu >= count:
        raise ValueError(f"{where}.gpu: no GPU {holder.gpu} (the host has {count})")
    for i, child in enumerate(holder.children):
        _check_gpus(child, f"{where}.children[{i}]", count)


def _comfyui(data: Any, gpus: int, base: Path) -> ComfyUISpec:
    from gpugate_sim.comfyui.nodes import MODEL_FOLDERS

    default = {f.name: f.default for f in attrs.fields(ComfyUISpec)}
    simple = {"listen", "gpu", "context", "steps_per_second", "node_seconds", "version"}
    knobs = {"load_seconds_per_gib", "sampler_bytes_per_megapixel", "enable_cors_header"}
    knobs |= {"max_upload_size", "preview_method", "disable_smart_memory", "record"}
    knobs |= {"custom_nodes", "reserve_vram", "dynamic_vram", "vram_headroom"}
    knobs |= {"offload_gib_per_second"}
    _only(data, "comfyui", simple | knobs | {"models"})
    files = []
    models = data.get("models") or {}
    _only(models, "comfyui.models", set(MODEL_FOLDERS))
    for folder, entries in models.items():
        where = f"comfyui.models.{folder}"
        if not isinstance(entries, dict):
            raise ValueError(f"{where}: expected a mapping of file name to size")
        for name in entries:
            files.append(ComfyModelFile(folder, str(name), _field_size(entries, name, where, 0)))
    cors = data.get("enable_cors_header")
    packs = data.get("custom_nodes") or []
    from gpugate_sim.comfyui.custom_pack import PACKS

    if not isinstance(packs, list) or any(p not in PACKS for p in packs):
        raise ValueError(f"comfyui.custom_nodes: expected a list of {sorted(PACKS)}, got {packs!r}")
    smart = data.get("disable_smart_memory", False)
    if not isinstance(smart, bool):
        raise ValueError(f"comfyui.disable_smart_memory: expected true or false, got {smart!r}")
    dynamic = data.get("dynamic_vram", False)
    if not isinstance(dynamic, bool):
        raise ValueError(f"comfyui.dynamic_vram: expected true or false, got {dynamic!r}")
    reserve = data.get("reserve_vram")
    spec = ComfyUISpec(
        listen=str(data.get("listen", default["listen"])),
        gpu=None if data.get("gpu") is None else _number(data, "gpu", "comfyui", int, 0, minimum=0),
        context=_field_size(data, "context", "comfyui", default["context"]),
        models=tuple(files),
        steps_per_second=_number(
            data, "steps_per_second", "comfyui", float, default["steps_per_second"], positive=True
        ),
        node_seconds=_duration(data, "node_seconds", "comfyui", 0.0),
        load_seconds_per_gib=_duration(data, "load_seconds_per_gib", "comfyui", 0.0),
        sampler_bytes_per_megapixel=_field_size(
            data, "sampler_bytes_per_megapixel", "comfyui", default["sampler_bytes_per_megapixel"]
        ),
        enable_cors_header=None if cors is None else ("*" if cors is True else str(cors)),
        max_upload_size=_number(
            data, "max_upload_size", "comfyui", float, default["max_upload_size"], positive=True
        ),
        preview_method=str(data.get("preview_method", default["preview_method"])),
        disable_smart_memory=smart,
        reserve_vram=None
        if reserve is None
        else _number(data, "reserve_vram", "comfyui", float, 0.0, minimum=0),
        dynamic_vram=dynamic,
        vram_headroom=_number(data, "vram_headroom", "comfyui", float, 0.0, minimum=0),
        offload_gib_per_second=_number(
            data,
            "offload_gib_per_second",
            "comfyui",
            float,
            default["offload_gib_per_second"],
            positive=True,
        ),
        version=str(data.get("version", default["version"])),
        record=record_path(data, "comfyui", base),
        custom_nodes=tuple(packs),
    )
    if spec.gpu is not None and spec.gpu >= gpus:
        raise ValueError(f"comfyui.gpu: no GPU {spec.gpu} (the host has {gpus})")
    return spec
