"""Every runtime the gate knows, by name, with its own section of a consumer's
configuration. The config loader reads `runtime:` and the runtime's section by this table;
`registry.py` gives each name its adapter. A runtime with no settings of its own has the
empty section."""

from __future__ import annotations

from gpugate.config.model import RuntimeSettings
from gpugate.runtimes.comfyui.settings import ComfyUISettings
from gpugate.runtimes.ollama.settings import OllamaSettings
from gpugate.runtimes.vllm.settings import VllmSettings

SECTIONS: dict[str, type[RuntimeSettings]] = {
    "ollama": OllamaSettings,
    "comfyui": ComfyUISettings,
    "whisper": RuntimeSettings,
    "llama-server": RuntimeSettings,
    "vllm": VllmSettings,
    "http": RuntimeSettings,
}


def runtime_name(text: str) -> str:
    """A runtime's name as written (any case, spaces around); ValueError for none known."""
    name = text.strip().lower()
    if name not in SECTIONS:
        raise ValueError(f"unknown runtime {text!r} (one of {', '.join(SECTIONS)})")
    return name
