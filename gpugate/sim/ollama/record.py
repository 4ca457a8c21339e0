"""The simulated Ollama's reading of each request on a route that loads (HOST.yaml
`ollama.record`), for the oracle fuzzer to compare with the Go oracle's.

One JSON line per request the route's handler read: its `case` query parameter, whether it
reached the scheduler (the only way a model loads), the model, keep_alive and runner
options it asked for, whether its body did not decode (Ollama's 400 before anything else),
and the 500 it got only after its model loaded. tests/faults/oracle_fuzz.py reads it back
beside the oracle's record of the same request.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable

import attrs
from aiohttp import web

from gpugate.sim.ollama.catalog import CatalogModel
from gpugate.sim.ollama.options import runner_set
from gpugate.sim.recordfile import RecordFile

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@attrs.define
class Reading:
    """What a handler made of one request, filled in as it reads."""

    t: float
    """time.time() when the handler started."""
    case: str
    path: str
    loads: bool = False
    """It reached the scheduler (Ollama's scheduleRunner asked GetRunner)."""
    model: str = ""
    """The model it asked for, as /api/tags names it (when it reached the scheduler)."""
    keep_alive: int | None = None
    """Its keep_alive in nanoseconds; None: not given."""
    runner: dict[str, int | bool] = attrs.field(factory=dict)
    """The runner options its `options` set (options.runner_set)."""
    malformed: bool = False
    """Its body did not decode into the route's request type."""
    after_load: str = ""
    """The 500 it was answered once its model had loaded (a format or template refused)."""
    status: int = 0

    def loading(
        self, model: CatalogModel, keep_alive: int | None, options: dict[str, object] | None
    ) -> CatalogModel:
        """The request reaches the scheduler for `model` with this keep_alive and these
        `options`: noted, and the model handed on."""
        self.loads = True
        self.model = model.display
        self.keep_alive = keep_alive
        self.runner = runner_set(options)
        return model


READING = web.RequestKey("reading", Reading)


def reading(request: web.Request) -> Reading:
    """The request's reading (a throwaway one when nothing records)."""
    try:
        return request[READING]
    except KeyError:
        found = Reading(time.time(), "", request.path)
        request[READING] = found
        return found


def recorded(records: Callable[[], RecordFile | None], handler: Handler) -> Handler:
    """`handler`, its reading written to the record file `records()` names (if any) once
    it has answered."""

    async def record(request: web.Request) -> web.StreamResponse:
        file = records()
        if file is None:
            return await handler(request)
        read = Reading(time.time(), request.rel_url.query.get("case", ""), request.path)
        request[READING] = read
        try:
            response = await handler(request)
            read.status = response.status
            return response
        except web.HTTPException as exc:
            read.status = exc.status
            raise
        finally:
            # A handler cancelled (its client left) is recorded too, with status 0: it
            # may have reached the scheduler first.
            file.write(read)

    return record
