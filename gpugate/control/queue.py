"""The queue people and routers see: `GET /gate/v1/queue`.

Every waiting demand with its consumer, model, class, GPU, place in its GPU's queue, how
long it has waited, what it waits for (`gpugate.core.waits`: a reason and one line) and
its deadline. `queue` is the one function the route, the status document (and so the
dashboard and `gpugate leases`), the capacity API and the agent-check read the queue
through, so they never disagree about it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from aiohttp import web

from gpugate.control.bodies import bad_request
from gpugate.core.waits import Waiting, queue_view

if TYPE_CHECKING:
    from gpugate.gate.gate import Gate


def queue(gate: Gate, gpu: int | None = None) -> tuple[Waiting, ...]:
    """Every waiting demand (on `gpu`, or on every GPU), in each queue's order, with what
    it waits for now. Read-only."""
    return queue_view(gate.core, gate.clock(), gpu)


def waiting_document(row: Waiting, now: float) -> dict[str, Any]:
    """One waiting demand, in bytes and seconds."""
    wait = row.wait
    holder = wait.holder
    return {
        "ticket": row.ticket,
        "consumer": row.consumer,
        "model": row.model,
        "class": row.priority.label,
        "gpu": row.gpu,
        "position": row.position,
        "bytes": row.demand.envelope,
        "waiting_seconds": round(max(0.0, now - row.arrived), 3),
        "deadline_in_seconds": round(row.deadline - now, 3),
        "reason": wait.reason.value,
        "line": wait.line,
        "short": wait.short,
        "holder": None
        if holder is None
        else {"consumer": holder.consumer, "model": holder.model, "options": holder.options},
        "hold": None if wait.hold is None else wait.hold.value,
        "until_seconds": None if wait.until is None else round(max(0.0, wait.until - now), 3),
        "behind": wait.behind,
        "unloading": [
            {"consumer": k.consumer, "model": k.model, "options": k.options} for k in wait.unloading
        ],
    }


def queue_documents(gate: Gate, rows: Iterable[Waiting]) -> list[dict[str, Any]]:
    """Waiting demands as the status document and the route list them."""
    now = gate.clock()
    return [waiting_document(row, now) for row in rows]


def _filters(gate: Gate, params: Mapping[str, str]) -> tuple[int | None, str | None]:
    """`gpu` and `consumer` of a queue question; ValueError when unknown."""
    gpu = None
    if "gpu" in params:
        text = params["gpu"].strip()
        if not text.isdigit() or int(text) not in gate.core.gpus():
            known = ", ".join(str(g) for g in gate.core.gpus()) or "none"
            raise ValueError(f"no GPU {text!r} (GPUs: {known})")
        gpu = int(text)
    consumer = params.get("consumer")
    if consumer is not None and consumer not in gate.links:
        fronted = ", ".join(sorted(gate.links)) or "none"
        raise ValueError(f"unknown consumer {consumer!r} (fronted: {fronted})")
    return gpu, consumer


def add_queue_route(app: web.Application, gate: Gate) -> None:
    """`GET /gate/v1/queue[?gpu=&consumer=]`."""

    async def route(request: web.Request) -> web.Response:
        try:
            gpu, consumer = _filters(gate, request.query)
        except ValueError as exc:
            return bad_request(str(exc))
        rows = [r for r in queue(gate, gpu) if consumer is None or r.consumer == consumer]
        return web.json_response({"queue": queue_documents(gate, rows)})

    app.router.add_get("/gate/v1/queue", route)
