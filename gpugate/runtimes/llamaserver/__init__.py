"""llama.cpp's `llama-server`: a router of many models (router.py) or one process with one
model (single.py). A consumer with a `control` (the gate starts and stops the process) is
a single-model server; without one the gate talks to a router already running."""

from __future__ import annotations

from gpugate.config.model import Consumer
from gpugate.runtimes.llamaserver.router import router_runtime
from gpugate.runtimes.llamaserver.single import single_runtime
from gpugate.runtimes.runtime import Runtime


def llama_server_runtime(consumer: Consumer) -> Runtime:
    """The runtime of a llama-server consumer, by the mode its configuration implies."""
    if consumer.control is not None:
        return single_runtime(consumer)
    return router_runtime(consumer)


__all__ = ["llama_server_runtime", "router_runtime", "single_runtime"]
