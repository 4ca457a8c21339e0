"""The gate's own refusals of a ComfyUI `POST /prompt`, in the shape ComfyUI answers with.

ComfyUI refuses a prompt with `{"error": {"type", "message", "details", "extra_info"},
"node_errors": {}}` (server.py `post_prompt`). Its frontend shows `message + ": " + details`
(ComfyUI_frontend `PromptExecutionError.toString`), and scripts read `error.type`. So:

* `type`: the failure class in lowercase, snake_case as ComfyUI's own types are
  (`insufficient_schedulable_vram` next to `prompt_outputs_failed_validation`);
* `message`: a short sentence a user understands ("Not enough free GPU memory");
* `details`: the gate's message with its numbers;
* `extra_info`: `failure_class` (as in `X-GPUGate-Failure`), and when known `retry_after`,
  `bytes_needed`, `bytes_schedulable`, `gpu`.

The body is written as aiohttp's `web.json_response` writes ComfyUI's (`json.dumps` defaults).
"""

from __future__ import annotations

import json

import attrs

from gpugate.core.failures import Failure, FailureClass
from gpugate.runtimes.replies import ErrorReply

CONTENT_TYPE = "application/json; charset=utf-8"

MESSAGES = {
    FailureClass.INSUFFICIENT_SCHEDULABLE_VRAM: "Not enough free GPU memory for this prompt",
    FailureClass.LEASE_TIMEOUT: "Timed out waiting for GPU memory",
    FailureClass.QUEUE_FULL: "Too many prompts are waiting for GPU memory",
    FailureClass.DEADLINE_CANNOT_BE_MET: "GPU memory cannot be free in time for this prompt",
    FailureClass.EXTERNAL_GPU_PRESSURE: "Other programs are using the GPU's memory",
    FailureClass.UNLEASED_GPU_USE: "The GPU's memory is over-committed",
    FailureClass.EVICTION_NOT_ALLOWED: "GPU memory is held by models that may not be unloaded",
    FailureClass.RESIDENCY_CONFLICT: "GPU memory is held by models that may not be unloaded",
    FailureClass.GPU_MEMORY_NOT_RECLAIMED: "Unloaded models did not give their GPU memory back",
    FailureClass.SCHEDULER_STATE_STALE: "The GPU's memory cannot be read right now",
    FailureClass.DRIVER_ERROR: "The GPU driver cannot be read",
    FailureClass.TIMEOUT: "ComfyUI did not answer in time",
    FailureClass.RUNTIME_CRASH: "ComfyUI is not answering",
}
"""What the ComfyUI frontend shows first; a class not listed gets a sentence of its name."""


def failure_message(failure_class: FailureClass) -> str:
    """The short sentence a ComfyUI user sees for `failure_class`."""
    default = "GPU gate: " + failure_class.value.lower().replace("_", " ")
    return MESSAGES.get(failure_class, default)


def comfyui_failure_reply(failure: Failure) -> ErrorReply:
    """A gate failure as ComfyUI's error body, with the class's status and Retry-After."""
    cls = failure.failure_class
    extra: dict[str, object] = {"failure_class": cls.value}
    for key in ("retry_after", "bytes_needed", "bytes_schedulable", "gpu"):
        value = getattr(failure, key)
        if value is not None:
            extra[key] = value
    details = failure.message if failure.detail is None else f"{failure.message} ({failure.detail})"
    payload = {
        "error": {
            "type": cls.value.lower(),
            "message": failure_message(cls),
            "details": details,
            "extra_info": extra,
        },
        "node_errors": {},
    }
    reply = ErrorReply(cls.http_status, json.dumps(payload).encode(), CONTENT_TYPE)
    return attrs.evolve(reply, failure_class=cls.value, retry_after=failure.retry_after)
