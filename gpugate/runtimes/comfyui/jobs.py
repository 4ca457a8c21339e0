"""ComfyUI's prompts as jobs: the prompt id its answer names, when a prompt ended (its
`/queue` and `/history`), and how one is stopped (deleted, interrupted)."""

from __future__ import annotations

import json
import urllib.parse
from typing import Any

import aiohttp

from gpugate.runtimes.answers import AdapterError, Classified, JobEnd
from gpugate.runtimes.comfyui.graph import PromptDemand
from gpugate.runtimes.parts import Jobs
from gpugate.runtimes.runtime import ModelSettings


class PromptJobs(Jobs):
    """One ComfyUI's prompts, by their ids."""

    def __init__(self, settings: ModelSettings) -> None:
        self.settings = settings

    def url(self, path: str) -> str:
        return self.settings.url(path)

    def job_key(self, classified: Classified, body: bytes) -> str | None:
        """The prompt id: the client's own when it chose one, else ComfyUI's answer's."""
        demand = classified.reading
        if isinstance(demand, PromptDemand) and demand.prompt_id is not None:
            return demand.prompt_id
        try:
            answer = json.loads(body)
        except ValueError:
            return None
        prompt_id = answer.get("prompt_id") if isinstance(answer, dict) else None
        return None if prompt_id is None else str(prompt_id)

    async def track_jobs(
        self, session: aiohttp.ClientSession, live: frozenset[str]
    ) -> list[JobEnd]:
        """Prompts no longer running or pending: in `/history` (success or error), or not
        there either (deleted from the queue before they ran)."""
        queued = await self._queued(session)
        ended = []
        for prompt_id in sorted(live - queued):
            if _routable(prompt_id):
                entry = await self._history(session, prompt_id)
            else:
                entry = await self._recent_history(session, prompt_id)
            if entry is None:
                ended.append(JobEnd(prompt_id, failed=True, detail="deleted from the queue"))
                continue
            status = entry.get("status") if isinstance(entry, dict) else None
            outcome = status.get("status_str") if isinstance(status, dict) else None
            ended.append(JobEnd(prompt_id, failed=outcome != "success", detail=str(outcome)))
        return ended

    async def preempt(self, session: aiohttp.ClientSession, job: str) -> None:
        """Delete the prompt if it waits, interrupt it if it runs (ComfyUI ignores the other).

        Deleting first: a prompt interrupted while still pending would be skipped by the
        targeted interrupt, then run once the worker took it."""
        async with session.post(self.url("/queue"), json={"delete": [job]}) as resp:
            if resp.status != 200:
                raise AdapterError(f"/queue answered {resp.status}")
        async with session.post(self.url("/interrupt"), json={"prompt_id": job}) as resp:
            if resp.status != 200:
                raise AdapterError(f"/interrupt answered {resp.status}")

    async def _queued(self, session: aiohttp.ClientSession) -> frozenset[str]:
        async with session.get(self.url("/queue")) as resp:
            if resp.status != 200:
                raise AdapterError(f"/queue answered {resp.status}")
            data = await resp.json(content_type=None)
        if not isinstance(data, dict):
            raise AdapterError("/queue answered something that is not an object")
        ids = set()
        for part in ("queue_running", "queue_pending"):
            items = data.get(part)
            if not isinstance(items, list):
                raise AdapterError(f"/queue has no {part} list")
            ids.update(str(item[1]) for item in items if isinstance(item, list) and len(item) > 1)
        return frozenset(ids)

    async def _recent_history(self, session: aiohttp.ClientSession, prompt_id: str) -> Any:
        """A job's history entry looked up in the recent history, for an id no URL path
        can name (ComfyUI takes any string as a prompt id: a lone surrogate, a slash)."""
        path = f"/history?max_items={RECENT_HISTORY}"
        async with session.get(self.url(path)) as resp:
            if resp.status != 200:
                raise AdapterError(f"{path} answered {resp.status}")
            data = await resp.json(content_type=None)
        if not isinstance(data, dict):
            raise AdapterError(f"{path} answered something that is not an object")
        return data.get(prompt_id)

    async def _history(self, session: aiohttp.ClientSession, prompt_id: str) -> Any:
        path = "/history/" + urllib.parse.quote(prompt_id, safe="")
        async with session.get(self.url(path)) as resp:
            if resp.status != 200:
                raise AdapterError(f"{path} answered {resp.status}")
            data = await resp.json(content_type=None)
        if not isinstance(data, dict):
            raise AdapterError(f"{path} answered something that is not an object")
        return data.get(prompt_id) if data else None


RECENT_HISTORY = 256
"""History entries read to find a job whose id cannot be put in a path: jobs are polled every
half second, so a finished one is among the newest."""


def _routable(prompt_id: str) -> bool:
    """Whether `/history/{id}` can name this id: one path segment, encodable as UTF-8."""
    if "/" in prompt_id or prompt_id in ("", ".", ".."):
        return False
    try:
        prompt_id.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True
