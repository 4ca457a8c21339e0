"""Ollama's parts: which requests load a model and how keep_alive is capped (its
reading), what its models refuse (its vetting), where its loads go (its placement); its
listing, unloads and estimates are the gate's calls to it (upstream.py).

Facts about Ollama's wire behaviour follow its source (server/routes.go, server/sched.go,
api/types.go; its request reading at v0.24.0, the scheduler at v0.33); see
docs/architecture.md for the route table and docs/reliability.md for the reading's rules.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping

import aiohttp
import attrs

from gpugate.config.model import Consumer, Residency
from gpugate.runtimes.answers import (
    ApiFamily,
    Classified,
    HealthSignal,
    Refusal,
    RouteKind,
    Screening,
    Vetted,
)
from gpugate.runtimes.dialect import BodyCoding
from gpugate.runtimes.health import RouteHealth
from gpugate.runtimes.ollama.afterload import NONE as NO_REFUSAL
from gpugate.runtimes.ollama.afterload import AfterLoad, after_load
from gpugate.runtimes.ollama.gojson import Bound, GoJsonError, go_string, splice
from gpugate.runtimes.ollama.gojson_fast import read_struct
from gpugate.runtimes.ollama.gojson_scan import ScanError
from gpugate.runtimes.ollama.host import OllamaHostCheck
from gpugate.runtimes.ollama.keepalive import (
    KeepAlive,
    KeepAliveError,
    effective_keep_alive,
    parse_keep_alive,
    policy_keep_alive,
)
from gpugate.runtimes.ollama.memory import OllamaMemory
from gpugate.runtimes.ollama.models import FRESH, ModelFactsCache
from gpugate.runtimes.ollama.multipart import read_transcription
from gpugate.runtimes.ollama.names import Source, model_ref, written_name
from gpugate.runtimes.ollama.needs import TRANSCRIPTION_NEEDS, Needs
from gpugate.runtimes.ollama.needs import refused as model_refuses
from gpugate.runtimes.ollama.placement import OllamaPlacement, from_options
from gpugate.runtimes.ollama.reading import (
    READERS,
    ZSTD_ROUTES,
    cloud_passthrough,
    is_unload,
    zstd_syntax_error,
)
from gpugate.runtimes.ollama.settings import OllamaSettings
from gpugate.runtimes.ollama.upstream import (
    OllamaInventory,
    OllamaResidents,
    host_headers,
    normalize_model,
)
from gpugate.runtimes.parts import Placement, Reading, Vetting
from gpugate.runtimes.replies import BodyLimit
from gpugate.runtimes.runtime import ModelSettings, Runtime

ZSTD_BODY = BodyCoding("zstd", window_log_max=23, inflated_limit=20 << 20)
"""The cloud passthrough's decoder: `zstd.WithDecoderMaxMemory(8<<20)` (a frame asking a
larger window is an error) and `maxDecompressedBodySize` (20 MiB, then a 400)."""

NATIVE_LOADS = {"/api/generate", "/api/chat", "/api/embed", "/api/embeddings"}
OPENAI_LOADS = {*ZSTD_ROUTES, "/v1/audio/transcriptions"}
"""The /v1 routes that load: the JSON ones behind the cloud passthrough, and transcriptions."""
RUNNER_OPTIONS = ("num_ctx", "num_batch", "num_gpu", "main_gpu", "use_mmap", "num_thread")
"""Load-time options: a change makes Ollama reload the model (sched.go needsReload)."""


@attrs.frozen
class OllamaDemand:
    """Ollama's reading of a demand (Classified.reading): what it needs of its model,
    checked before a lease, and what Ollama can refuse it for once the model is loaded."""

    needs: Needs
    after_load: AfterLoad = NO_REFUSAL


def api_family(path: str) -> ApiFamily:
    if path.startswith("/api/"):
        return ApiFamily.OLLAMA
    if path.startswith("/v1/"):
        return ApiFamily.OPENAI
    return ApiFamily.PLAIN


def options_key(options: object) -> str:
    """Canonical text of the runner options in a request ("" when none are set)."""
    if not options or not isinstance(options, Mapping):
        return ""
    parts = []
    for name in RUNNER_OPTIONS:
        value = options.get(name)
        if value is not None:
            # ints and bools (most runner options) without json.dumps' call overhead
            if type(value) is int:
                text = str(value)
            elif type(value) is bool:
                text = "true" if value else "false"
            else:
                text = json.dumps(value, sort_keys=True)
            parts.append(f"{name}={text}")
    return ",".join(parts)


class OllamaReading(Reading):
    """How one Ollama reads a request: its routes that load, its Go decoder, its keep_alive,
    and the checks of an Ollama listening where the gate listens."""

    # Go's net/http reads any body, and no route wraps one in MaxBytesReader but for its
    # inflated zstd bodies (BodyCoding.inflated_limit): the gate keeps its own bound,
    # refused in the route's JSON error shape.
    body_limit = BodyLimit()

    def __init__(self, settings: ModelSettings) -> None:
        self.settings = settings
        consumer = settings.consumer
        self.host_check = OllamaHostCheck(
            consumer.listen.host, consumer.settings_as(OllamaSettings).origins
        )
        self._ceilings: dict[Residency, KeepAlive] = {}

    def allowed_keep_alive(self, model: str) -> KeepAlive:
        """The longest keep_alive this model's policy allows."""
        residency = self.settings.residency(model)
        allowed = self._ceilings.get(residency)
        if allowed is None:
            allowed = self._ceilings[residency] = policy_keep_alive(residency.policy, residency.ttl)
        return allowed

    def screen(self, method: str, headers: Mapping[str, str], *, target: str = "") -> Screening:
        """Ollama's CORS and Host checks, as an Ollama on the consumer's `listen` runs them."""
        return self.host_check.screen(method, headers, target=target)

    def decoded_coding(self, path: str, content_encoding: str) -> BodyCoding | None:
        """cloudPassthroughMiddleware inflates a zstd body on the /v1 routes behind it
        (`c.GetHeader("Content-Encoding") == "zstd"`, exactly; server/cloud_proxy.go:80)."""
        return ZSTD_BODY if content_encoding == "zstd" and path in ZSTD_ROUTES else None

    def wants_body(self, method: str, path: str) -> bool:
        """Must the body be read to classify this request?"""
        return method == "POST" and (path in NATIVE_LOADS or path in OPENAI_LOADS)

    def classify(
        self,
        method: str,
        path: str,
        body: bytes | None,
        content_type: str,
        *,
        query: str = "",
    ) -> Classified:
        """Decide whether a request may load a model, and rewrite its keep_alive.

        `query` is the URL's query string: /v1/audio/transcriptions reads its model from
        it before the form (Go's FormValue).
        """
        api = api_family(path)
        if not self.wants_body(method, path) or body is None:
            return Classified(RouteKind.PASS, api)
        if path == "/v1/audio/transcriptions":
            return self._classify_multipart(api, body, content_type, query)
        # Read as Ollama's Go decoder reads it: a body it refuses is answered 400 before
        # anything loads, so it goes up untouched for Ollama to word the error.
        reader = READERS[path]
        try:
            bound = read_struct(body, reader.kind)
        except (GoJsonError, ScanError):
            unread = zstd_syntax_error(path, body)
            if unread is not None:
                return Classified(RouteKind.REFUSE, api, refusal=Refusal(400, unread))
            return Classified(RouteKind.PASS, api)
        if api is ApiFamily.OPENAI and cloud_passthrough(bound):
            return Classified(RouteKind.PASS, api)
        if reader.refused(bound):
            return Classified(RouteKind.PASS, api)
        model = bound.get("model")
        ref = model_ref(go_string(model)) if isinstance(model, str) else None
        if ref is None or ref.source is Source.CLOUD:
            return Classified(RouteKind.PASS, api)  # Ollama: 400/404, or the cloud
        # What the handler the route ends in will ask of the model, checked before a lease.
        needs = reader.needs(bound)
        if path == "/api/embeddings":
            # EmbeddingsHandler looks its model up by the name as written (routes.go:893);
            # the others fold its case to an installed name first (getExistingName).
            needs = attrs.evolve(needs, exact_name=written_name(go_string(model)))
        if api is ApiFamily.OPENAI:
            residency = self.settings.residency(ref.name)
            # /v1 cannot carry keep_alive, so the gate owns these models' idle time.
            reading = OllamaDemand(needs)
            return Classified(
                RouteKind.DEMAND, api, ref.name, idle_ttl=residency.idle_ttl, reading=reading
            )
        return self._classify_native(path, bound, ref.name, needs)

    def _classify_native(self, path: str, bound: Bound, model: str, needs: Needs) -> Classified:
        api = ApiFamily.OLLAMA
        try:
            requested = parse_keep_alive(bound.get("keep_alive"))
        except KeepAliveError:
            return Classified(RouteKind.PASS, api)  # Ollama's bind error, before any load
        if requested is not None and requested.zero and is_unload(path, bound):
            return Classified(RouteKind.UNLOAD, api, model)
        allowed = self.allowed_keep_alive(model)
        effective = effective_keep_alive(requested, allowed)
        return Classified(
            RouteKind.DEMAND,
            api,
            model,
            options_key(bound.get("options")),
            body=_rewrite_keep_alive(bound, requested, effective),
            idle_ttl=None if effective.forever else effective.seconds,
            sets_ttl=True,
            reading=OllamaDemand(needs, after_load(path, bound)),
        )

    def _classify_multipart(
        self, api: ApiFamily, body: bytes, content_type: str, query: str
    ) -> Classified:
        form = read_transcription(body, content_type, query)
        ref = model_ref(form.model) if form is not None else None
        if ref is None or ref.source is Source.CLOUD:
            return Classified(RouteKind.PASS, api)
        residency = self.settings.residency(ref.name)
        return Classified(
            RouteKind.DEMAND,
            api,
            ref.name,
            idle_ttl=residency.idle_ttl,
            reading=OllamaDemand(TRANSCRIPTION_NEEDS),
        )

    def refused_after_load(self, classified: Classified, status: int, body: bytes) -> bool:
        """Ollama's 500 for a format or a template it refuses once the model is loaded
        (afterload.py): the model is resident, nothing failed to load."""
        reading = classified.reading
        return isinstance(reading, OllamaDemand) and reading.after_load.refused(status, body)


class OllamaVetting(Vetting):
    """A request the model itself makes Ollama refuse (a capability it lacks, a remote
    stub) goes up unleased, for Ollama to word the refusal."""

    def __init__(self, model_facts: ModelFactsCache) -> None:
        self.model_facts = model_facts

    async def vet(
        self, classified: Classified, session: aiohttp.ClientSession, now: float
    ) -> Vetted | None:
        reading = classified.reading
        if not isinstance(reading, OllamaDemand) or classified.model is None:
            return None
        needs = reading.needs
        cache = self.model_facts
        if needs.exact_name is not None:
            installed = await cache.installed(session, now)
            if needs.exact_name not in installed:
                installed = await cache.installed(session, now, max_age=FRESH)
            if needs.exact_name not in installed:
                return Vetted()  # Ollama's 404: no model by that exact name
        facts = await cache.facts(session, classified.model, now)
        if facts is None or not model_refuses(needs, facts):
            return None
        # Forwarded unleased only on a fresh answer: a model pulled again may do more now.
        facts = await cache.facts(session, classified.model, now, max_age=FRESH)
        if facts is None or not model_refuses(needs, facts):
            return None
        return Vetted()


class OllamaPlacing(Placement):
    """Ollama's own rule for where a request's load goes (placement.py)."""

    def __init__(self, consumer: Consumer, model_facts: ModelFactsCache) -> None:
        self.spread = consumer.settings_as(OllamaSettings).sched_spread
        self.model_facts = model_facts

    def placement_rule(self, classified: Classified) -> OllamaPlacement | None:
        # The vetting before the lease asked /api/show: its block count is known by now.
        facts = self.model_facts.known(classified.model or "")
        return from_options(
            classified.options_key,
            spread=self.spread,
            layers=facts.layers if facts is not None and facts.layers else None,
        )


def ollama_runtime(consumer: Consumer) -> Runtime:
    """One Ollama behind the gate: listed (`/api/ps`, its health too), vetted and placed by
    what it says of its models; `GET /api/version` answers 200 once it serves."""
    # consumers.yaml names resolve as request names do: `library/m`, `M` and `m:latest`
    # configure the same model.
    settings = ModelSettings(consumer, model_key=normalize_model)
    facts = ModelFactsCache(
        consumer.upstream.url, host_headers(consumer), consumer.timeouts.control
    )
    return Runtime(
        settings=settings,
        reading=OllamaReading(settings),
        residents=OllamaResidents(consumer),
        health=RouteHealth(
            HealthSignal.LISTING, settings.url("/api/version"), headers=host_headers(consumer)
        ),
        vetting=OllamaVetting(facts),
        inventory=OllamaInventory(consumer),
        memory=OllamaMemory(settings, consumer, host_headers(consumer)),
        placement=OllamaPlacing(consumer, facts),
    )


def _rewrite_keep_alive(
    bound: Bound, requested: KeepAlive | None, effective: KeepAlive
) -> bytes | None:
    """The body with exactly one keep_alive, the effective one; None to send it as it came.

    Go reads the last of the members whose key folds to keep_alive: that one keeps its
    place and key, the others go. A body that has none gets one appended. Every other
    byte stays as the client sent it.
    """
    members = bound.members("keep_alive")
    value = _json_number(effective.to_json())
    if not members:
        return splice(bound, None, f'"keep_alive":{value}', ())
    *others, last = members
    if requested is not None and effective.seconds == requested.seconds:
        if not others:
            return None
        value = bound.text[last.value_start : last.end]
    return splice(bound, last, value, others)


def _json_number(value: int | float) -> str:
    """json.dumps of a number, without its encoder's setup for one value."""
    if type(value) is int:
        return int.__repr__(value)
    if type(value) is float and math.isfinite(value):
        return float.__repr__(value)
    return json.dumps(value)
