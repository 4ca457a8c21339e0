"""Every runtime this gate ships, by name, with its own section of a consumer's
configuration, and consumers.yaml read with them.

config/ is below runtimes/ and never imports this: the loader is handed a table. This module
is where the commands that read the file (check, status, lease, admit, the operator's and
the watch) get the shipped one; it imports only the runtimes' `settings.py`, so such a
command loads no adapter. `registry.py` pairs the table with each runtime's adapter, for
`serve`. A runtime with no settings of its own has the empty section.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from gpugate.config import loader
from gpugate.config.loader import LoadedConfig
from gpugate.config.model import Config
from gpugate.config.runtime_table import RuntimeEntry, RuntimeTable
from gpugate.runtimes.comfyui.settings import ComfyUISettings
from gpugate.runtimes.ollama.settings import OllamaSettings
from gpugate.runtimes.vllm.settings import VllmSettings

RUNTIME_TABLE = RuntimeTable(
    (
        RuntimeEntry("ollama", OllamaSettings),
        RuntimeEntry("comfyui", ComfyUISettings),
        RuntimeEntry("whisper"),
        RuntimeEntry("llama-server"),
        RuntimeEntry("vllm", VllmSettings),
        RuntimeEntry("http"),
    )
)
"""The runtimes a consumer may name, in the order `gpugate check` lists them."""


def load_config(path: Path) -> Config:
    """`config.loader.load_config` with the shipped runtimes."""
    return loader.load_config(path, runtimes=RUNTIME_TABLE)


def load_config_with_warnings(path: Path) -> LoadedConfig:
    """`config.loader.load_config_with_warnings` with the shipped runtimes."""
    return loader.load_config_with_warnings(path, runtimes=RUNTIME_TABLE)


def load_config_text(text: str, source: Path, environ: Mapping[str, str] | None = None) -> Config:
    """`config.loader.load_config_text` with the shipped runtimes."""
    return loader.load_config_text(text, source, environ, runtimes=RUNTIME_TABLE)


def load_config_text_with_warnings(
    text: str, source: Path, environ: Mapping[str, str] | None = None
) -> LoadedConfig:
    """`config.loader.load_config_text_with_warnings` with the shipped runtimes."""
    return loader.load_config_text_with_warnings(text, source, environ, runtimes=RUNTIME_TABLE)
