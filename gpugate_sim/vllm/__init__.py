"""A simulated vLLM OpenAI-compatible server (`vllm serve MODEL`) with sleep mode.

    python -m gpugate_sim.vllm serve MODEL --host H --port P [vllm serve options] [--sim-...]

takes `--gpu-memory-utilization` of the simulated card's total memory before it serves,
refuses to start when less than that is free, and (with VLLM_SERVER_DEV_MODE=1 and
--enable-sleep-mode) gives memory back on `POST /sleep` and takes it again on
`POST /wake_up`, as vLLM does. Tests and the simulated host run it with `SimVllm`;
docs/runtimes/vllm.md lists what it models of vLLM and what it does not.
"""

from __future__ import annotations

from gpugate_sim.vllm.process import SimVllm, VllmStartError, vllm_argv
from gpugate_sim.vllm.spec import VllmServerSpec

__all__ = ["SimVllm", "VllmServerSpec", "VllmStartError", "vllm_argv"]
