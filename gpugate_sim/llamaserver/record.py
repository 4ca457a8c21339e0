"""The record of model loads (`--sim-record`, HOST.yaml `llamaserver.record`).

One JSON line per load a llama-server process finished or failed: when, which process,
which model, whether it loaded, and what it took on the GPU. A router's children write to
the same file, so a fuzzer's oracle sees every load, wherever it happened.
"""

from __future__ import annotations

import attrs

from gpugate_sim.recordfile import RecordFile


@attrs.frozen
class LoadRecord:
    t: float
    pid: int
    model: str
    loaded: bool
    n_ctx: int
    gpu_layers: int
    bytes: int
    """What the model holds on the GPU once loaded (0 when nothing was offloaded)."""


Records = RecordFile
"""The record file of this runtime's lines."""
