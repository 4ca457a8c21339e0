"""Faults a test can switch on in a running simulated Ollama, and what they provoked.

Switched at start by HOST.yaml (`ollama.faults`) or later through `POST /sim/faults`:

* `ps: garbage` — `/api/ps` answers 200 with a body that is not its JSON (a runtime in a
  bad state, a proxy in between answering for it);
* `keep_memory: true` — an unloaded runner's memory is not given back: the bytes stay
  held by the Ollama server process, as when a runner leaks or a driver does not reclaim.
* `reap_seconds: S` — an unloaded runner stays in `/api/ps` for S seconds after its
  process died and its memory came back. Ollama drops a runner from its list only once
  `Close` has reaped the process (Go's `cmd.Wait`, which also drains the runner's pipes),
  so a listing taken as the memory returns still names it; this widens that window.

`GET /sim/faults` shows the switches and counts the unload requests received
(`keep_alive` 0 with nothing to generate), so a test can tell one unload from a loop.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable

import attrs
from aiohttp import web
from aiohttp.web_protocol import RequestPayloadError

from gpugate_sim.faultspec import FaultSpec, PsFault, parse_faults

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

GARBAGE = b'<html><body>502 Bad Gateway</body></html>\x00{"models": ['
UNLOAD_ROUTES = ("/api/generate", "/api/chat")
ZERO_KEEP_ALIVE = (0, 0.0, "0", "0s", "0m", "0h")


@attrs.define
class SimFaults:
    """The live switches and the counts they are judged by."""

    ps: PsFault = PsFault.NONE
    keep_memory: bool = False
    reap_seconds: float = 0.0
    """How long an unloaded runner stays listed after its memory came back."""
    unload_requests: int = 0
    ps_requests: int = 0
    leaked: int = 0
    """Bytes of unloaded runners kept held because of `keep_memory`."""

    @classmethod
    def from_spec(cls, spec: FaultSpec) -> SimFaults:
        return cls(ps=spec.ps, keep_memory=spec.keep_memory)

    def as_json(self) -> dict[str, object]:
        return {
            "ps": self.ps.value,
            "keep_memory": self.keep_memory,
            "reap_seconds": self.reap_seconds,
            "unload_requests": self.unload_requests,
            "ps_requests": self.ps_requests,
            "leaked": self.leaked,
        }

    def install(self, app: web.Application) -> None:
        """Add the middleware and the /sim/faults routes to the app."""
        app.middlewares.append(self._middleware)
        app.router.add_get("/sim/faults", self._show, allow_head=False)
        app.router.add_post("/sim/faults", self._set)

    async def _show(self, request: web.Request) -> web.Response:
        return web.json_response(self.as_json())

    async def _set(self, request: web.Request) -> web.Response:
        try:
            data = await request.json()
            spec = parse_faults({k: v for k, v in data.items() if k in ("ps", "keep_memory")})
        except (ValueError, AttributeError) as exc:
            return web.json_response({"error": str(exc)}, status=400)
        if "ps" in data:
            self.ps = spec.ps
        if "keep_memory" in data:
            self.keep_memory = spec.keep_memory
        if "reap_seconds" in data:
            reap = data["reap_seconds"]
            if isinstance(reap, bool) or not isinstance(reap, (int, float)) or reap < 0:
                return web.json_response(
                    {"error": f"reap_seconds: expected seconds, got {reap!r}"}, status=400
                )
            self.reap_seconds = float(reap)
        return web.json_response(self.as_json())

    @web.middleware
    async def _middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.method == "GET" and request.path == "/api/ps":
            self.ps_requests += 1
            if self.ps is PsFault.GARBAGE:
                return web.Response(body=GARBAGE, content_type="application/json")
        elif request.method == "POST" and request.path in UNLOAD_ROUTES:
            # The body is cached by aiohttp, so the handler reads it again unchanged; a body
            # that cannot be read fails the handler's own read the same way.
            try:
                raw = await request.read()
            except (web.HTTPException, RequestPayloadError):
                raw = b""
            if _is_unload(raw):
                self.unload_requests += 1
        return await handler(request)


def _is_unload(raw: bytes) -> bool:
    try:
        body = json.loads(raw)
    except (ValueError, RecursionError):
        return False  # not an unload Ollama would read either
    if not isinstance(body, dict):
        return False
    nothing = not body.get("prompt") and not body.get("messages")
    return nothing and body.get("keep_alive") in ZERO_KEEP_ALIVE
