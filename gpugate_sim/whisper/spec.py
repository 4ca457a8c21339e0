"""The `whisper:` section of HOST.yaml: a simulated whisper.cpp whisper-server."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import attrs

from gpugate.core.units import parse_duration
from gpugate_sim.specfields import field_size, number, only, record_path


@attrs.frozen
class WhisperServerSpec:
    """A simulated whisper-server: one model in VRAM from start to exit, /load to swap it."""

    listen: str = "127.0.0.1:8080"
    model: str = "models/ggml-base.en.bin"
    gpu: int = 0
    models: dict[str, int] = attrs.field(factory=dict)
    """Model files on the simulated disk (path or file name) and the VRAM each takes loaded."""
    load_seconds: float = 0.0
    decode_seconds: float = 0.0
    decode_per_audio_second: float = 0.0
    inference_path: str = "/inference"
    request_path: str = ""
    keepalive_timeout: float = 5.0
    keepalive_max: int = 100
    oom: str = "abort"
    """A model that does not fit at start: `abort` (SIGABRT) or `exit` (status 3)."""
    record: Path | None = None
    """A file to which every /load and /inference answer is appended as a JSON line (a
    fuzzer's oracle: gpugate_sim.whisper.record)."""


def parse_whisper(data: Any, base: Path = Path()) -> WhisperServerSpec:
    """Read the `whisper:` mapping; ValueError naming the field. `base`: the host file's
    directory, which a relative `record` path starts from."""
    fields = {f.name for f in attrs.fields(WhisperServerSpec)}
    only(data, "whisper", fields)
    default = {f.name: f.default for f in attrs.fields(WhisperServerSpec)}
    models = data.get("models") or {}
    if not isinstance(models, dict):
        raise ValueError("whisper.models: expected a mapping of model file to size")
    sizes = {str(path): field_size(models, path, "whisper.models", 0) for path in models}

    def seconds(key: str) -> float:
        try:
            return parse_duration(data.get(key, 0))
        except ValueError as exc:
            raise ValueError(f"whisper.{key}: {exc}") from None

    oom = str(data.get("oom", "abort"))
    if oom not in ("abort", "exit"):
        raise ValueError(f"whisper.oom: expected abort or exit, got {oom!r}")
    listen = str(data.get("listen", default["listen"]))
    _, sep, port = listen.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"whisper.listen: expected HOST:PORT, got {listen!r}")
    keepalive = data.get("keepalive_timeout", default["keepalive_timeout"])
    try:
        keepalive = parse_duration(keepalive)
    except ValueError as exc:
        raise ValueError(f"whisper.keepalive_timeout: {exc}") from None
    return WhisperServerSpec(
        listen=listen,
        model=str(data.get("model", default["model"])),
        gpu=number(data, "gpu", "whisper", int, 0, minimum=0),
        models=sizes,
        load_seconds=seconds("load_seconds"),
        decode_seconds=seconds("decode_seconds"),
        decode_per_audio_second=number(
            data, "decode_per_audio_second", "whisper", float, 0.0, minimum=0
        ),
        inference_path=str(data.get("inference_path", default["inference_path"])),
        request_path=str(data.get("request_path", "")),
        keepalive_timeout=keepalive,
        keepalive_max=number(data, "keepalive_max", "whisper", int, 100, minimum=1),
        oom=oom,
        record=record_path(data, "whisper", base),
    )
