"""The record of `POST /prompt` answers (HOST.yaml `comfyui.record`), for a fuzzer's oracle.

One JSON line per request the handler answered: when it started, the request's `case`
query parameter, the status, and whether the prompt went on the queue (the only way a
prompt can load a model). tests/faults/records.py reads it back.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable

import attrs
from aiohttp import web

from gpugate_sim.recordfile import RecordFile

Handler = Callable[[web.Request, list[str]], Awaitable[web.StreamResponse]]
"""A `POST /prompt` handler that appends the id of a prompt it queues to the list."""


@attrs.frozen
class PromptRecord:
    t: float
    """time.time() when the handler started."""
    case: str
    """The `case` query parameter, "" without one."""
    status: int
    queued: bool
    prompt_id: str | None
    """The queued prompt's id; None when nothing was queued."""


PromptRecords = RecordFile
"""The record file of this runtime's lines."""


async def answer_recorded(
    records: PromptRecords | None, request: web.Request, handler: Handler
) -> web.StreamResponse:
    """`handler`'s answer, its record written first (when there is a record file)."""
    started = time.time()
    queued: list[str] = []

    def record(status: int) -> None:
        if records is not None:
            case = request.rel_url.query.get("case", "")
            prompt_id = queued[0] if queued else None
            records.write(PromptRecord(started, case, status, bool(queued), prompt_id))

    try:
        response = await handler(request, queued)
    except web.HTTPException as exc:
        record(exc.status)
        raise
    except Exception:
        # aiohttp answers what a handler raises with a 500. A cancelled handler (the client
        # left) answers nothing and is not recorded.
        record(500)
        raise
    record(response.status)
    return response
