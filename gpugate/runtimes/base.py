"""The runtime adapter interface, and what an adapter answers about a request and a
runtime.

The gate, the unload runner, the listeners and `serve` know runtimes only through
`RuntimeAdapter`: a composition of small protocols (facets.py), each part of the gate using
the one it needs. Adding a runtime is one package in `runtimes/` and one entry in
`registry.py`.
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
from gpugate.runtimes.facets import (
    GpuPlacement,
    HealthCheck,
    JobControl,
    ModelSettings,
    ProcessLife,
    RequestReading,
    ResidentControl,
)
from gpugate.runtimes.replies import ErrorReply

__all__ = [
    "AdapterError",
    "ApiFamily",
    "Classified",
    "ErrorReply",
    "HealthCheck",
    "HealthSignal",
    "JobControl",
    "JobEnd",
    "LoadedModel",
    "Measured",
    "ModelSettings",
    "NotSupported",
    "ProcessLife",
    "ReclaimRule",
    "Refusal",
    "RequestReading",
    "ResidentControl",
    "RouteKind",
    "RuntimeAdapter",
    "Screening",
    "Vetted",
    "error_reply",
    "failure_reply",
    "go_json",
    "llama_error_type",
    "vllm_error_type",
]


class RuntimeAdapter(
    ModelSettings,
    RequestReading,
    ResidentControl,
    JobControl,
    ProcessLife,
    GpuPlacement,
    HealthCheck,
):
    """What the gate needs from one consumer's runtime; one instance per consumer.

    The shared parts hold the consumer's configuration lookups and the defaults every
    runtime shares; a runtime family implements the request reading and the calls to its
    upstream.
    """
