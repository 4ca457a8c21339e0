"""Operator actions over the control API (control tokens only, like every write).

    POST /gate/v1/residents/{consumer}/{model}/evict[?force=1]   202 {"key": ...}; 200
        {"key": ..., "loaded": false} for a model the consumer knows that is not loaded
    POST /gate/v1/consumers/{name}/drain | /undrain               200 consumer document
    GET  /gate/v1/consumers/{name}                                draining, drained, since, by
    POST /gate/v1/gpus/{index}/pause | /resume                    200 {"gpu", "paused", ...}

Each action is an event naming who asked; an eviction's `eviction_done` follows when the
unload runner is through.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING

from aiohttp import web

from gpugate.control.auth import CALLER
from gpugate.control.leases import FAILURE_HEADER
from gpugate.control.marks import consumer_document, pause_fields
from gpugate.core.operator import EvictionRefused, Refusal
from gpugate.core.residents import ResidentKey

if TYPE_CHECKING:
    from gpugate.gate.gate import Gate

TRUE = ("1", "true", "yes")


def who(request: web.Request) -> str:
    """Who asked, for the event: the identity's name, or "token" for a control token."""
    caller = request[CALLER]
    return caller.identity or "token"


def error(status: int, error_class: str, message: str) -> web.Response:
    body = {"error": {"class": error_class, "message": message}}
    return web.json_response(body, status=status, headers={FAILURE_HEADER: error_class})


def add_operator_routes(app: web.Application, gate: Gate) -> None:
    """Register the operator routes on the control app."""

    def resident_key(request: web.Request) -> ResidentKey | None:
        consumer, model = request.match_info["consumer"], request.match_info["model"]
        link = gate.links.get(consumer)
        if link is not None:
            # As the runtime names it (a bare name may carry its default tag there).
            model = link.runtime.settings.model_key(model)
        options = request.query.get("options")
        if options is not None:
            return ResidentKey(consumer, model, options)
        # Without options: the one resident of that consumer and model, whatever its options.
        # A model split across GPUs is one resident per card: one model all the same.
        found = {r.key.whole for r in gate.core.residents() if r.key[:2] == (consumer, model)}
        if len(found) == 1:
            return found.pop()
        return ResidentKey(consumer, model) if not found else None

    def known(key: ResidentKey) -> bool:
        """A model the consumer's configuration names or the gate has measured loaded."""
        link = gate.links.get(key.consumer)
        consumer = next((c for c in gate.config.consumers if c.name == key.consumer), None)
        if link is None or consumer is None:
            return False
        named = {link.runtime.settings.model_key(override.name) for override in consumer.models}
        return key.model in named or gate.envelopes.seen(key.consumer, key.model)

    async def evict(request: web.Request) -> web.Response:
        key = resident_key(request)
        if key is None:
            return error(409, "RESIDENCY_CONFLICT", "several residents match: give ?options=")
        force = request.query.get("force", "0").lower() in TRUE
        try:
            try:
                gate.evict(key, force=force, who=who(request))
            except EvictionRefused as refused:
                link = gate.links.get(key.consumer)
                if refused.refusal is not Refusal.UNKNOWN or link is None:
                    raise
                if link.runtime.inventory is None:
                    raise
                # The books know a listed runtime's models from its last listing, which may
                # predate a load: ask it now, and only then say it holds no such model.
                with contextlib.suppress(Exception):
                    await gate.signals.reconcile(link)
                key = resident_key(request) or key
                gate.evict(key, force=force, who=who(request))
        except EvictionRefused as refused:
            if refused.refusal is Refusal.UNKNOWN and known(key):
                # Already not loaded is what was asked for (a runtime's own unload of a
                # model it does not hold answers success too): done, nothing to unload.
                document = {"consumer": key.consumer, "model": key.model, "options": key.options}
                return web.json_response({"key": document, "force": force, "loaded": False})
            if refused.refusal is Refusal.UNKNOWN:
                return error(404, "NOT_FOUND", str(refused))
            if refused.refusal is Refusal.ALWAYS_WARM:
                return error(409, "EVICTION_NOT_ALLOWED", str(refused))
            return error(409, "RESIDENCY_CONFLICT", str(refused))
        document = {"consumer": key.consumer, "model": key.model, "options": key.options}
        return web.json_response({"key": document, "force": force}, status=202)

    def consumer(request: web.Request) -> str | web.Response:
        name = request.match_info["name"]
        if gate.links.get(name) is None and all(c.name != name for c in gate.config.consumers):
            return error(404, "NOT_FOUND", f"no consumer {name!r}")
        return name

    async def drain(request: web.Request) -> web.Response:
        name = consumer(request)
        if isinstance(name, web.Response):
            return name
        gate.drain(name, who=who(request))
        return web.json_response(consumer_document(gate, name))

    async def undrain(request: web.Request) -> web.Response:
        name = consumer(request)
        if isinstance(name, web.Response):
            return name
        gate.undrain(name, who=who(request))
        return web.json_response(consumer_document(gate, name))

    async def show(request: web.Request) -> web.Response:
        name = consumer(request)
        if isinstance(name, web.Response):
            return name
        return web.json_response(consumer_document(gate, name))

    def gpu(request: web.Request) -> int | web.Response:
        try:
            index = int(request.match_info["index"])
        except ValueError:
            return error(
                400, "BAD_REQUEST", f"gpu: expected an index, got {request.match_info['index']!r}"
            )
        known = {g.index for g in gate.config.gpus} | set(gate.core.gpus())
        if index not in known:
            return error(404, "NOT_FOUND", f"no GPU {index}")
        return index

    async def pause(request: web.Request) -> web.Response:
        index = gpu(request)
        if isinstance(index, web.Response):
            return index
        gate.pause(index, who=who(request))
        return web.json_response({"gpu": index, **pause_fields(gate, index)})

    async def resume(request: web.Request) -> web.Response:
        index = gpu(request)
        if isinstance(index, web.Response):
            return index
        gate.resume(index, who=who(request))
        return web.json_response({"gpu": index, **pause_fields(gate, index)})

    app.router.add_post("/gate/v1/residents/{consumer}/{model}/evict", evict)
    app.router.add_get("/gate/v1/consumers/{name}", show)
    app.router.add_post("/gate/v1/consumers/{name}/drain", drain)
    app.router.add_post("/gate/v1/consumers/{name}/undrain", undrain)
    app.router.add_post("/gate/v1/gpus/{index}/pause", pause)
    app.router.add_post("/gate/v1/gpus/{index}/resume", resume)
