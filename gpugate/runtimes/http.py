"""Any HTTP runtime (`runtime: http`, e.g. mVoice): its memory is its process's.

The gate cannot read what such a runtime's requests do, so every request passes as it
is. Its memory is a static reservation of the consumer's `envelope`: a PROCESS-scope
lease taken when the gate starts, which becomes a resident following NVML once the
process shows it. With `control:` it is started on demand and evicted by stopping it,
exactly as whisper-server is; without, it is never evicted (the gate cannot stop it).
"""

from __future__ import annotations

import aiohttp

from gpugate.runtimes.base import ApiFamily, Classified, HealthSignal, RouteKind
from gpugate.runtimes.controlled import ProcessAdapter


class HttpAdapter(ProcessAdapter):
    """A runtime known only by its envelope and, optionally, its control."""

    @property
    def health_signal(self) -> HealthSignal:
        # Without a control nothing says where such a runtime answers whether it is well
        # (or whether it serves HTTP at all): it is shown, and never fails the gate's health.
        return HealthSignal.PROCESS if self.process is not None else HealthSignal.UNOBSERVED

    def wants_body(self, method: str, path: str) -> bool:
        return False

    def classify(
        self, method: str, path: str, body: bytes | None, content_type: str, *, query: str = ""
    ) -> Classified:
        return Classified(RouteKind.PASS, ApiFamily.PLAIN)

    async def health(self, session: aiohttp.ClientSession) -> bool:
        """The control's health path answers 200 (`/` when there is no control)."""
        path = self.consumer.control.health if self.consumer.control is not None else "/"
        async with session.get(self.url(path)) as resp:
            await resp.read()
            return resp.status < 400
