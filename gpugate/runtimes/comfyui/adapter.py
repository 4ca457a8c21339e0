"""The ComfyUI adapter: admission at `POST /prompt`, job leases, completion from `/history`
and `/queue`, eviction with `/free`.

Every route but `POST /prompt` (and its `/api` twin) passes untouched and unread: the UI,
`/view` with its Range header, uploads streamed as they come, the `/ws` socket. A prompt
is the only request that puts models on the card, and it does so later, when ComfyUI's
one worker runs it: the `POST` answers as soon as the prompt is queued. So its lease has
JOB scope: it starts when the prompt is admitted and ends when `track_jobs` finds the
prompt finished, failed, interrupted or deleted. What ComfyUI keeps loaded afterwards
(smart memory) is a resident known from NVML, given back with `POST /free`.
"""

from __future__ import annotations

import json
import urllib.parse
from collections.abc import Mapping
from typing import Any, ClassVar

import aiohttp
from aiohttp.helpers import parse_content_type

from gpugate.config.model import Consumer
from gpugate.core.tickets import LeaseScope
from gpugate.runtimes.base import (
    AdapterError,
    ApiFamily,
    Classified,
    HealthSignal,
    JobEnd,
    LoadedModel,
    Measured,
    NotSupported,
    ReclaimRule,
    Refusal,
    RouteKind,
    RuntimeAdapter,
    Screening,
    Vetted,
)
from gpugate.runtimes.comfyui.envelope import (
    PROMPT_OPTIONS,
    PromptSizing,
    prompt_envelope,
)
from gpugate.runtimes.comfyui.graph import PromptDemand, TooDeep, Unreadable, read_prompt
from gpugate.runtimes.comfyui.origin import (
    Verdict,
    cache_headers,
    cors_headers,
    origin_verdict,
    request_path,
    server_error,
)
from gpugate.runtimes.comfyui.settings import ComfyUISettings
from gpugate.runtimes.comfyui.validation import Outcome
from gpugate.runtimes.comfyui.vetting import CONTENT_TYPE, PromptVetting
from gpugate.runtimes.dialect import ServerDialect
from gpugate.runtimes.replies import BodyLimit, ErrorReply, aiohttp_too_large

PROMPT_ROUTES = frozenset({"/prompt", "/api/prompt"})
MAX_UPLOAD_SIZE = 100 * 1024 * 1024
"""ComfyUI's `--max-upload-size` default (100, in MB as it counts them), which server.py
gives aiohttp as `client_max_size`: the most body any of its handlers reads."""
FREE_BODY = {"unload_models": True, "free_memory": True}
"""`free_memory` too: under --highvram the offload device is the GPU, and only dropping
the node caches lets the weights go (runtime-contracts §2.5)."""


class ComfyUIAdapter(RuntimeAdapter):
    """One ComfyUI consumer."""

    reconcilable: ClassVar[bool] = False
    tracks_jobs: ClassVar[bool] = True
    sizes_requests: ClassVar[bool] = True
    reclaim_rule: ClassVar[ReclaimRule] = ReclaimRule(to_idle=True)
    dialect: ClassVar[ServerDialect] = ServerDialect.AIOHTTP
    body_limit: ClassVar[BodyLimit] = BodyLimit(MAX_UPLOAD_SIZE, aiohttp_too_large)

    @property
    def health_signal(self) -> HealthSignal:
        # ComfyUI has no listing; `/system_stats` answers whenever its server runs.
        return HealthSignal.HEALTH_ROUTE

    def __init__(self, consumer: Consumer) -> None:
        super().__init__(consumer)
        self.sizing = PromptSizing.of(consumer)
        self.vetting = PromptVetting(consumer.upstream.url, consumer.timeouts.control)
        self.settings = consumer.settings_as(ComfyUISettings)
        self.vets = self.settings.validate_prompts

    # -- reading requests ------------------------------------------------------------------

    def screen(self, method: str, headers: Mapping[str, str], *, target: str = "") -> Screening:
        """ComfyUI's origin check, or with `cors_header` its CORS middleware, as a ComfyUI
        listening where the gate listens runs it: before anything is admitted or evicted.

        The gate sends `Host` as the upstream's own (loopback) address, so the upstream's
        own check would judge the wrong pair (an Origin naming the upstream's hidden address
        would even pass there): the decision is made here and Origin is not sent up. Both
        middleware read the headers, never the request-target's authority; `target` gives
        only the path, for what ComfyUI's cache middleware adds to these answers.
        """
        allowed = self.settings.cors_header
        if allowed is not None:
            cors = cors_headers(allowed)
            if method == "OPTIONS":
                # The CORS middleware answers every preflight itself, on any path.
                extra = cache_headers(request_path(target), 200)
                reply = ErrorReply(200, b"", "", headers=cors + extra)
                return Screening(reply=reply, drop_up=("Origin",))
            return Screening(reply_headers=cors, drop_up=("Origin",))
        host, origin = headers.get("Host"), headers.get("Origin")
        if host is None or origin is None:
            return Screening(drop_up=("Origin",))
        verdict = origin_verdict(host, origin)
        if verdict is Verdict.MISMATCH:
            extra = cache_headers(request_path(target), 403)
            return Screening(reply=ErrorReply(403, b"", "", headers=extra), drop_up=("Origin",))
        if verdict is Verdict.ERROR:
            body, content_type = server_error(headers.get("Accept", ""))
            reply = ErrorReply(500, body, content_type, headers=(("Connection", "close"),))
            return Screening(reply=reply, drop_up=("Origin",))
        return Screening(drop_up=("Origin",))

    def wants_body(self, method: str, path: str) -> bool:
        return method == "POST" and path in PROMPT_ROUTES

    def classify(
        self, method: str, path: str, body: bytes | None, content_type: str, *, query: str = ""
    ) -> Classified:
        if not self.wants_body(method, path):
            return Classified(RouteKind.PASS, ApiFamily.PLAIN)
        if body is None:
            return Classified(RouteKind.PASS, ApiFamily.JOB_QUEUE)
        demand = read_prompt(body, parse_content_type(content_type)[1].get("charset"))
        if isinstance(demand, Unreadable):
            # ComfyUI answers its own error, without loading anything.
            return Classified(RouteKind.PASS, ApiFamily.JOB_QUEUE)
        if isinstance(demand, TooDeep):
            # Whether ComfyUI's json.loads reads it depends on ComfyUI's own stack: refused
            # as ComfyUI refuses a body it cannot read, and never forwarded unread.
            text, kind = server_error("")
            exact = ErrorReply(500, text, kind, headers=(("Connection", "close"),))
            refusal = Refusal(500, text.decode(), exact=exact)
            return Classified(RouteKind.REFUSE, ApiFamily.JOB_QUEUE, refusal=refusal)
        return Classified(
            RouteKind.DEMAND,
            ApiFamily.JOB_QUEUE,
            model=demand.key,
            options_key=PROMPT_OPTIONS,
            idle_ttl=self.consumer.residency.idle_ttl,
            scope=LeaseScope.JOB,
            reading=demand,
            scale=demand.megapixels,
        )

    async def vet(
        self, classified: Classified, session: aiohttp.ClientSession, now: float
    ) -> Vetted | None:
        """ComfyUI's own 400 for a prompt it will refuse, from its node catalog and its
        files; a prompt only ComfyUI can judge (or word the refusal of) is leased only
        once ComfyUI has accepted it."""
        demand = classified.reading
        if not isinstance(demand, PromptDemand) or not self.settings.validate_prompts:
            return None
        verdict = await self.vetting.verdict(demand, session, now)
        if verdict.outcome is Outcome.QUEUE:
            return None
        if verdict.outcome is Outcome.REFUSE and verdict.exact:
            return Vetted(ErrorReply(400, verdict.body, CONTENT_TYPE))
        return Vetted(runtime_decides=True)

    def size(
        self, classified: Classified, measured: Measured | None, ceiling: int | None
    ) -> int | None:
        """The prompt's files and working set, or a measured peak of the same files."""
        demand = classified.reading
        if not isinstance(demand, PromptDemand):
            return None
        envelope = prompt_envelope(
            demand,
            self.sizing,
            None if measured is None else measured.bytes,
            measured_megapixels=None if measured is None else measured.scale,
            ceiling=ceiling,
        )
        return envelope.bytes

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

    # -- talking to the runtime ------------------------------------------------------------

    async def listing(self, session: aiohttp.ClientSession) -> list[LoadedModel]:
        raise NotSupported(f"{self.consumer.name}: ComfyUI does not list what it holds")

    async def evict(self, session: aiohttp.ClientSession, model: str) -> None:
        """`POST /free`: ComfyUI answers at once and frees between prompts (NVML confirms)."""
        async with session.post(self.url("/free"), json=FREE_BODY) as resp:
            if resp.status != 200:
                raise AdapterError(f"/free answered {resp.status}")

    async def health(self, session: aiohttp.ClientSession) -> bool:
        async with session.get(self.url("/system_stats")) as resp:
            return resp.status == 200

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
