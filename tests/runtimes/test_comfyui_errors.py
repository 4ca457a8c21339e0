"""The gate's refusals of `POST /prompt` in ComfyUI's error shape."""

from __future__ import annotations

import json

from gpugate.core.failures import Failure, FailureClass
from gpugate.core.units import GiB
from gpugate.runtimes.comfyui.errors import comfyui_failure_reply


def test_a_capacity_refusal_reads_as_comfyuis_own_error() -> None:
    failure = Failure(
        FailureClass.INSUFFICIENT_SCHEDULABLE_VRAM,
        "INSUFFICIENT_SCHEDULABLE_VRAM: the prompt needs 14.0 GiB, the card has 9.0 GiB",
        consumer="comfyui",
        model="ae.safetensors+flux1-dev-fp8.safetensors",
        gpu=0,
        bytes_needed=14 * GiB,
        bytes_schedulable=9 * GiB,
        retry_after=30.0,
    )
    reply = comfyui_failure_reply(failure)
    assert (reply.status, reply.content_type) == (503, "application/json; charset=utf-8")
    assert (reply.failure_class, reply.retry_after) == ("INSUFFICIENT_SCHEDULABLE_VRAM", 30.0)
    # aiohttp's json_response, as ComfyUI answers: json.dumps with its default separators.
    assert reply.body == json.dumps(json.loads(reply.body)).encode()
    assert json.loads(reply.body) == {
        "error": {
            "type": "insufficient_schedulable_vram",
            "message": "Not enough free GPU memory for this prompt",
            "details": failure.message,
            "extra_info": {
                "failure_class": "INSUFFICIENT_SCHEDULABLE_VRAM",
                "retry_after": 30.0,
                "bytes_needed": 14 * GiB,
                "bytes_schedulable": 9 * GiB,
                "gpu": 0,
            },
        },
        "node_errors": {},
    }


def test_what_the_comfyui_frontend_shows() -> None:
    reply = comfyui_failure_reply(
        Failure(FailureClass.LEASE_TIMEOUT, "LEASE_TIMEOUT: waited 2m", detail="queue of 3")
    )
    error = json.loads(reply.body)["error"]
    # PromptExecutionError.toString: message + ": " + details (node_errors add nothing).
    shown = error["message"] + ": " + error["details"]
    assert shown == "Timed out waiting for GPU memory: LEASE_TIMEOUT: waited 2m (queue of 3)"
    assert error["extra_info"] == {"failure_class": "LEASE_TIMEOUT"}


def test_every_class_has_a_status_a_type_and_a_sentence() -> None:
    for cls in FailureClass:
        reply = comfyui_failure_reply(Failure(cls, f"{cls.value}: what happened"))
        data = json.loads(reply.body)
        assert reply.status == cls.http_status and reply.failure_class == cls.value
        assert set(data) == {"error", "node_errors"} and data["node_errors"] == {}
        assert set(data["error"]) == {"type", "message", "details", "extra_info"}
        assert data["error"]["type"] == cls.value.lower()
        assert data["error"]["message"] and "_" not in data["error"]["message"]
    timeout = comfyui_failure_reply(Failure(FailureClass.TIMEOUT, "TIMEOUT: no answer"))
    assert timeout.status == 504
    corrupt = comfyui_failure_reply(Failure(FailureClass.ARTIFACT_CORRUPT, "x"))
    assert json.loads(corrupt.body)["error"]["message"] == "GPU gate: artifact corrupt"
