"""The control app's views for people and scripts: the dashboard, live streams, history,
measured envelopes and the OpenAPI document, with the tasks behind them."""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from importlib import resources
from typing import TYPE_CHECKING, Any

from aiohttp import web

from gpugate.control.bodies import bad_request
from gpugate.control.history import SNAPSHOT_INTERVAL, HistoryRecorder, point_document
from gpugate.control.live import BadFilter, EventFilter, LiveFeed, event_document
from gpugate.control.openapi import openapi_document
from gpugate.core.units import parse_duration

if TYPE_CHECKING:
    from gpugate.gate.gate import Gate

STATIC = resources.files("gpugate.control") / "static"
HISTORY_WINDOW = 86400.0
"""What `GET /gate/v1/history` covers when `since` is not given."""
HISTORY_KEY = web.AppKey("history", HistoryRecorder)
FEED_KEY = web.AppKey("live", LiveFeed)


def _since(text: str | None, now: float) -> float:
    """`since`: wall-clock seconds, or a duration back from now ("24h"); ValueError for
    anything else (`nan`, `inf`, digits past a double's range)."""
    if not text:
        return now - HISTORY_WINDOW
    try:
        value = float(text)
    except ValueError:
        return now - parse_duration(text)
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"since: expected seconds or a duration, got {text[:40]!r}")
    # A small number is a duration; a large one is a time.
    return value if value > 10 * 365 * 86400 else now - value


def _gpu(text: str | None) -> int | None:
    """`gpu`: an NVML index; ValueError for anything else."""
    if not text:
        return None
    if not (text.isascii() and text.isdigit()) or len(text) > 6:
        raise ValueError(f"gpu: expected an NVML index, got {text[:40]!r}")
    return int(text)


MOST_RECENT = 10**9
"""What `recent` past nine digits means: every event kept."""


def recent_count(query: Any) -> int:
    """`recent`: how many of the latest events (0 when absent); BadFilter for anything but
    a whole number."""
    text = (query.get("recent") or "").strip()
    if not text:
        return 0
    if not (text.isascii() and text.isdigit()):
        raise BadFilter(f"recent: expected a number of events, got {text[:40]!r}")
    return MOST_RECENT if len(text) > 9 else int(text)


def add_observe_routes(
    app: web.Application,
    gate: Gate,
    document: Callable[[], dict[str, Any]],
    *,
    history_interval: float | None = None,
) -> None:
    """Register the dashboard, streams, history, envelopes and OpenAPI routes and tasks."""
    feed = LiveFeed(gate, document)
    recorder = HistoryRecorder(gate, interval=history_interval or SNAPSHOT_INTERVAL)
    app[FEED_KEY] = feed
    app[HISTORY_KEY] = recorder

    async def started(app: web.Application) -> None:
        feed.start()
        recorder.start()

    async def stopping(app: web.Application) -> None:
        # Before cleanup: open streams end now rather than holding the shutdown up.
        await feed.stop()

    async def cleanup(app: web.Application) -> None:
        await recorder.stop()

    app.on_startup.append(started)
    app.on_shutdown.append(stopping)
    app.on_cleanup.append(cleanup)

    async def dashboard(request: web.Request) -> web.Response:
        page = (STATIC / "index.html").read_text()
        return web.Response(text=page, content_type="text/html", charset="utf-8")

    async def static(request: web.Request) -> web.Response:
        name = request.match_info["name"]
        types = {".js": "text/javascript", ".css": "text/css", ".svg": "image/svg+xml"}
        kind = next((t for ext, t in types.items() if name.endswith(ext)), None)
        target = STATIC / name
        if kind is None or "/" in name or not target.is_file():
            raise web.HTTPNotFound()
        return web.Response(
            text=target.read_text(),
            content_type=kind,
            charset="utf-8",
            headers={"Cache-Control": "no-cache"},
        )

    async def stream(request: web.Request) -> web.StreamResponse:
        # A page that opens the stream sees the last events at once, then each as it happens.
        try:
            wanted = EventFilter.from_query(request.query)
        except BadFilter as exc:
            return bad_request(str(exc))
        return await feed.stream(
            request,
            wanted=wanted,
            snapshots=True,
            backlog=gate.recent_events()[-50:],
        )

    async def history(request: web.Request) -> web.Response:
        store = gate.store
        now = time.time()
        query = request.query
        try:
            gpu = _gpu(query.get("gpu"))
            since = _since(query.get("since"), now)
            step = parse_duration(query["step"]) if query.get("step") else 60.0
        except ValueError as exc:
            return bad_request(f"gpu, since or step: {exc}")
        if step <= 0:
            return bad_request("step must be positive")
        points = [] if store is None else await store.history(gpu, since, step)
        return web.json_response(
            {
                "since": round(since, 3),
                "step": step,
                "retention": gate.config.gate.history_retention,
                "points": [point_document(p) for p in points],
            }
        )

    async def envelopes(request: web.Request) -> web.Response:
        store = gate.store
        rows = [] if store is None else await store.envelopes()
        return web.json_response(
            {
                "envelopes": [
                    {
                        "consumer": e.consumer,
                        "model": e.model,
                        "options": e.options,
                        "bytes": e.bytes,
                        "measured": e.measured,
                        "runtime_version": e.runtime_version,
                    }
                    for e in rows
                ]
            }
        )

    async def openapi(request: web.Request) -> web.Response:
        return web.json_response(openapi_document())

    app.router.add_get("/", dashboard)
    app.router.add_get("/static/{name}", static)
    app.router.add_get("/gate/v1/stream", stream)
    app.router.add_get("/gate/v1/history", history)
    app.router.add_get("/gate/v1/envelopes", envelopes)
    app.router.add_get("/gate/v1/openapi.json", openapi)


async def follow_events(request: web.Request, gate: Gate) -> web.StreamResponse:
    """`GET /gate/v1/events?follow=1`: the matching events as server-sent events."""
    feed = request.app[FEED_KEY]
    try:
        wanted = EventFilter.from_query(request.query)
        recent = recent_count(request.query)
    except BadFilter as exc:
        return bad_request(str(exc))
    backlog = [e for e in gate.recent_events() if wanted(e)][-recent:] if recent else []
    return await feed.stream(request, wanted=wanted, snapshots=False, backlog=backlog)


def filtered_events(request: web.Request, gate: Gate) -> list[str]:
    """The recent events that match the query's filters, one JSON line each (BadFilter for
    a filter that names no class)."""
    wanted = EventFilter.from_query(request.query)
    recent = recent_count(request.query)
    lines = [json.dumps(event_document(e, gate)) for e in gate.recent_events() if wanted(e)]
    return lines[-recent:] if recent > 0 else lines
