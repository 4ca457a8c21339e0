"""ComfyUI's parts: admission at `POST /prompt`, job leases (their ends from `/history`
and `/queue`: jobs.py), prompts sized from their files, eviction with `/free`.

Every route but `POST /prompt` (and its `/api` twin) passes untouched and unread: the UI,
`/view` with its Range header, uploads streamed as they come, the `/ws` socket. A prompt
is the only request that puts models on the card, and it does so later, when ComfyUI's
one worker runs it: the `POST` answers as soon as the prompt is queued. So its lease has
JOB scope: it starts when the prompt is admitted and ends when `track_jobs` finds the
prompt finished, failed, interrupted or deleted. What ComfyUI keeps loaded afterwards
(smart memory) is a resident known from NVML, given back with `POST /free`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import aiohttp
from aiohttp.helpers import parse_content_type

from gpugate.config.model import Consumer
from gpugate.core.classes import PriorityClass
from gpugate.core.residents import ResidentKey
from gpugate.core.tickets import LeaseScope
from gpugate.core.units import GiB
from gpugate.runtimes.answers import (
    AdapterError,
    ApiFamily,
    Classified,
    HealthSignal,
    ReclaimRule,
    Refusal,
    RouteKind,
    Screening,
)
from gpugate.runtimes.comfyui.envelope import (
    PROMPT_OPTIONS,
    PromptSizing,
    prompt_envelope,
)
from gpugate.runtimes.comfyui.graph import PromptDemand, TooDeep, Unreadable, read_prompt
from gpugate.runtimes.comfyui.jobs import PromptJobs
from gpugate.runtimes.comfyui.origin import (
    Verdict,
    cache_headers,
    cors_headers,
    origin_verdict,
    request_path,
    server_error,
)
from gpugate.runtimes.comfyui.settings import ComfyUISettings
from gpugate.runtimes.comfyui.vetting import PromptVetting
from gpugate.runtimes.dialect import ServerDialect
from gpugate.runtimes.footprint import Cap, Cards, Elasticity, Footprint, Knob
from gpugate.runtimes.health import RouteHealth
from gpugate.runtimes.parts import Bounds, Memory, Reading, Residents
from gpugate.runtimes.replies import BodyLimit, ErrorReply, aiohttp_too_large
from gpugate.runtimes.runtime import ModelSettings, Runtime

PROMPT_ROUTES = frozenset({"/prompt", "/api/prompt"})
FREE_ROUTES = frozenset({"/free", "/api/free"})
"""server.py `post_free` (and its /api twin): sets the queue's unload flags, which the
prompt worker acts on between prompts (main.py `prompt_worker`)."""
MAX_UPLOAD_SIZE = 100 * 1024 * 1024
"""ComfyUI's `--max-upload-size` default (100, in MB as it counts them), which server.py
gives aiohttp as `client_max_size`: the most body any of its handlers reads."""
FREE_BODY = {"unload_models": True, "free_memory": True}
"""`free_memory` too: under --highvram the offload device is the GPU, and only dropping
the node caches lets the weights go (runtime-contracts §2.5)."""


class ComfyUIReading(Reading):
    """How one ComfyUI reads a request: only a prompt may load, and its origin check or
    CORS middleware answer first."""

    dialect = ServerDialect.AIOHTTP
    body_limit = BodyLimit(MAX_UPLOAD_SIZE, aiohttp_too_large)

    def __init__(self, consumer: Consumer) -> None:
        self.cors_header = consumer.settings_as(ComfyUISettings).cors_header
        self.idle_ttl = consumer.residency.idle_ttl

    def screen(self, method: str, headers: Mapping[str, str], *, target: str = "") -> Screening:
        """ComfyUI's origin check, or with `cors_header` its CORS middleware, as a ComfyUI
        listening where the gate listens runs it: before anything is admitted or evicted.

        The gate sends `Host` as the upstream's own (loopback) address, so the upstream's
        own check would judge the wrong pair (an Origin naming the upstream's hidden address
        would even pass there): the decision is made here and Origin is not sent up. Both
        middleware read the headers, never the request-target's authority; `target` gives
        only the path, for what ComfyUI's cache middleware adds to these answers.
        """
        allowed = self.cors_header
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
        if method == "POST" and path in FREE_ROUTES:
            # Memory may come back soon: the gate watches for it (nothing is leased).
            return Classified(RouteKind.UNLOAD, ApiFamily.PLAIN)
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
            idle_ttl=self.idle_ttl,
            scope=LeaseScope.JOB,
            reading=demand,
            scale=demand.megapixels,
        )


class ComfyUIResidents(Residents):
    """`POST /free`: ComfyUI answers at once and frees between prompts (NVML confirms), back
    to the context it keeps while idle."""

    reclaim_rule = ReclaimRule(to_idle=True)

    def __init__(self, consumer: Consumer) -> None:
        self.consumer = consumer
        self.url = consumer.upstream.url + "/free"

    async def evict(self, session: aiohttp.ClientSession, model: str) -> None:
        async with session.post(self.url, json=FREE_BODY) as resp:
            if resp.status != 200:
                raise AdapterError(f"/free answered {resp.status}")

    def evict_timeout(self) -> float:
        return self.consumer.timeouts.control


class PromptMemory(Memory):
    """A prompt's files and working set, read from the prompt: ComfyUI cannot size a model
    by its name.

    FITTED: in NORMAL_VRAM ComfyUI loads a model partially when the card is short
    (comfy/model_management.py `load_models_gpu`: `lowvram_model_memory` from the device's
    free memory less `minimum_memory_required`), and frees its other models for the one a
    node needs (`free_memory`), so a prompt runs, slower, in as little as its largest stage
    and the working set (the floor) and takes its files and working set whole with room
    (the ceiling). Its knob is `--reserve-vram GB` (cli_args.py; `EXTRA_RESERVED_VRAM`):
    what it keeps free of the memory it sees free, read once at start (`reserve_vram`)."""

    elasticity = Elasticity.FITTED
    knob = "--reserve-vram"

    def __init__(self, settings: ModelSettings, consumer: Consumer) -> None:
        super().__init__(settings)
        self.consumer = consumer
        self.sizing = PromptSizing.of(consumer)

    def size(
        self, classified: Classified, kind: ResidentKey, priority: PriorityClass, bounds: Bounds
    ) -> Footprint | None:
        """The prompt's files and working set, or a measured peak of the same files (the
        ceiling); its floor the largest stage. What the card can give it is the core's to
        weigh: short of the ceiling it grants the floor, and says so (`degraded`)."""
        demand = classified.reading
        if not isinstance(demand, PromptDemand):
            return None
        measured = bounds.measured_job(kind)
        envelope = prompt_envelope(
            demand,
            self.sizing,
            None if measured is None else measured.bytes,
            measured_megapixels=None if measured is None else measured.scale,
        )
        return Footprint(envelope.bytes, min(envelope.floor, envelope.bytes))

    def cap(self, model: str, nbytes: int, cards: Cards) -> Cap | None:
        """None: ComfyUI has no knob for the most one load may take. `--reserve-vram` is
        read once, at start, and is kept free of the memory the card has free at each load
        (comfy/model_management.py `load_models_gpu`: `lowvram_model_memory` is the free
        memory less `minimum_memory_required`, which adds `extra_reserved_memory()`), not
        of its total: "the card less a lease" would cut every load by what the other
        holders on the card hold. Its process is told the gate's reserve instead
        (`reserve_vram`, in the drop-in `gpugate init` writes)."""
        return None


RESERVE_KNOB = Knob(("--reserve-vram",))


def reserve_vram(reserve: int) -> Cap:
    """`--reserve-vram GB` for a reserve of `reserve` bytes: ComfyUI multiplies the value
    by 1024³ (model_management.py `EXTRA_RESERVED_VRAM = args.reserve_vram * 1024 * 1024 *
    1024`; a float, cli_args.py), rounded up to a hundredth so it keeps at least that."""
    value = math.ceil(reserve * 100 / GiB) / 100
    return Cap(args=("--reserve-vram", f"{value:g}"), knob=RESERVE_KNOB)


def comfyui_runtime(consumer: Consumer) -> Runtime:
    """One ComfyUI behind the gate: its prompts are jobs, sized from their files, vetted
    against its node catalog (`validate_prompts`); it has no listing, and `/system_stats`
    answers whenever its server runs."""
    settings = ModelSettings(consumer)
    validate = consumer.settings_as(ComfyUISettings).validate_prompts
    return Runtime(
        settings=settings,
        reading=ComfyUIReading(consumer),
        residents=ComfyUIResidents(consumer),
        health=RouteHealth(HealthSignal.HEALTH_ROUTE, settings.url("/system_stats")),
        vetting=(
            PromptVetting(consumer.upstream.url, consumer.timeouts.control) if validate else None
        ),
        jobs=PromptJobs(settings),
        memory=PromptMemory(settings, consumer),
    )
