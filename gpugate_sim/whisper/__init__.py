"""A simulated whisper.cpp `whisper-server`: its HTTP contract, its model held in simulated VRAM.

    python -m gpugate_sim.whisper -m MODEL --host H --port P [--sim-state-dir DIR ...]

loads MODEL into the simulated GPU before binding its port, as the real server does, and
prints `whisper server listening at http://H:P` once it listens (into C-like stdout
buffering: a pipe sees it at exit). Tests and the simulated host start and stop it with
`SimWhisper`; `whisper_argv` is its command line. docs/runtimes/whisper.md lists what it
models of whisper.cpp's server and what it does not.
"""

from __future__ import annotations

from gpugate_sim.whisper.process import SimWhisper, WhisperStartError, whisper_argv
from gpugate_sim.whisper.spec import WhisperServerSpec

__all__ = ["SimWhisper", "WhisperServerSpec", "WhisperStartError", "whisper_argv"]
