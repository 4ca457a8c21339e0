"""What every route handler needs, attached to the aiohttp application."""

from __future__ import annotations

import attrs
from aiohttp import web

from gpugate.sim.ollama.binding import BindError, EmptyBody
from gpugate.sim.ollama.catalog import Catalog
from gpugate.sim.ollama.engine import Engine
from gpugate.sim.ollama.scheduler import Scheduler
from gpugate.sim.scenario import OllamaSpec


@attrs.frozen
class Services:
    spec: OllamaSpec
    catalog: Catalog
    scheduler: Scheduler
    engine: Engine


SERVICES = web.AppKey("services", Services)


def services(request: web.Request) -> Services:
    return request.app[SERVICES]


def keep_alive_of(body: dict[str, object]) -> int | None:
    """The request's keep_alive in nanoseconds (binding decoded it); None when absent or
    null."""
    value = body.get("keep_alive")
    return value if isinstance(value, int) else None


def bind_message(error: BindError) -> str:
    """What Ollama's /api handlers answer for a body that did not bind."""
    return "missing request body" if isinstance(error, EmptyBody) else str(error)
