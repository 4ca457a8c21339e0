"""A simulated Ollama: the real HTTP contract, runner child processes holding simulated VRAM.

    python -m gpugate_sim.ollama serve --host-file HOST.yaml --state-dir DIR

prints `READY http://HOST:PORT` once it listens. In-process, tests use `SimOllama`.
This package's own modules import nothing heavy at package level, so the runner child
(`python -m gpugate_sim.ollama.runner`) starts quickly.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gpugate_sim.ollama.server import PreloadError, SimOllama

__all__ = ["PreloadError", "SimOllama"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from gpugate_sim.ollama import server

        return getattr(server, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
