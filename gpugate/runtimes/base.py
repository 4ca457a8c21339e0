"""The runtime interface, in one place: what the gate knows of a runtime (a `Runtime`, the
record of its parts: parts.py, runtime.py) and what a runtime answers about a request
(answers.py).

The gate, the unload runner, the listeners and `serve` know runtimes only through their
parts, each part of the gate taking the one it uses. Adding a runtime is one package in
`runtimes/` that builds its consumers' `Runtime`, and one entry in `registry.py`.
"""

from __future__ import annotations

from gpugate.runtimes.answers import (
    AdapterError,
    ApiFamily,
    Classified,
    HealthSignal,
    JobEnd,
    LoadedModel,
    Measured,
    NotSupported,
    ReclaimRule,
    Refusal,
    RouteKind,
    Screening,
    Vetted,
    error_reply,
    failure_reply,
    go_json,
    llama_error_type,
    vllm_error_type,
)
from gpugate.runtimes.parts import (
    Bounds,
    Health,
    Inventory,
    Jobs,
    Lifecycle,
    Memory,
    Placement,
    Reading,
    Residents,
    Vetting,
    placing,
)
from gpugate.runtimes.replies import ErrorReply
from gpugate.runtimes.runtime import ModelSettings, Runtime, RuntimeFactory

__all__ = [
    "AdapterError",
    "ApiFamily",
    "Bounds",
    "Classified",
    "ErrorReply",
    "Health",
    "HealthSignal",
    "Inventory",
    "JobEnd",
    "Jobs",
    "Lifecycle",
    "LoadedModel",
    "Measured",
    "Memory",
    "ModelSettings",
    "NotSupported",
    "Placement",
    "Reading",
    "ReclaimRule",
    "Refusal",
    "Residents",
    "RouteKind",
    "Runtime",
    "RuntimeFactory",
    "Screening",
    "Vetted",
    "Vetting",
    "error_reply",
    "failure_reply",
    "go_json",
    "llama_error_type",
    "placing",
    "vllm_error_type",
]
