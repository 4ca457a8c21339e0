"""Any HTTP runtime (`runtime: http`, e.g. mVoice): its memory is its process's.

The gate cannot read what such a runtime's requests do, so every request passes as it
is. Its memory is a static reservation of the consumer's `envelope`: a PROCESS-scope
lease taken when the gate starts, which becomes a resident following NVML once the
process shows it. With `control:` it is started on demand and evicted by stopping it,
exactly as whisper-server is; without, it is never evicted (the gate cannot stop it).
"""

from __future__ import annotations

from gpugate.config.model import Consumer
from gpugate.runtimes.answers import ApiFamily, Classified, HealthSignal, RouteKind
from gpugate.runtimes.controlled import ProcessModel, make_control, process_runtime
from gpugate.runtimes.parts import Reading
from gpugate.runtimes.runtime import Runtime


class PassReading(Reading):
    """Every request passes as it is: nothing says what it does."""

    def wants_body(self, method: str, path: str) -> bool:
        return False

    def classify(
        self, method: str, path: str, body: bytes | None, content_type: str, *, query: str = ""
    ) -> Classified:
        return Classified(RouteKind.PASS, ApiFamily.PLAIN)


def _answers(status: int) -> bool:
    return status < 400


def http_runtime(consumer: Consumer) -> Runtime:
    """A runtime known only by its envelope and, optionally, its control: well when the
    control's health path answers below 400. Without a control nothing says where it
    answers whether it is well (or whether it serves HTTP at all): it is shown, and never
    fails the gate's health."""
    control = consumer.control
    return process_runtime(
        consumer,
        PassReading(),
        ProcessModel(consumer),
        control=make_control(consumer),
        health_path=control.health if control is not None else "/",
        healthy=_answers,
        unobserved=HealthSignal.UNOBSERVED,
    )
