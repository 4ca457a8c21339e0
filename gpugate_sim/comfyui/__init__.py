"""A simulated ComfyUI: its HTTP and websocket contract, one process holding its VRAM.

    python -m gpugate_sim.comfyui serve --host-file HOST.yaml --state-dir DIR

prints `READY http://HOST:PORT` once it listens. In-process, tests use `SimComfyUI`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gpugate_sim.comfyui.server import SimComfyUI

__all__ = ["SimComfyUI"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from gpugate_sim.comfyui import server

        return getattr(server, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
