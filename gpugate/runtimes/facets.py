"""The parts a runtime adapter is made of, each a small protocol of its own: its
configuration lookups, how its requests are read, how it lists and evicts what it holds,
its jobs, its process, its health. `RuntimeAdapter` (base.py) is their composition; each
part of the gate uses the one it needs (the listener: `RequestReading`)."""

from __future__ import annotations

import abc
from collections.abc import Mapping
from typing import ClassVar

import aiohttp

from gpugate.config.model import Consumer, ModelOverride, Residency
from gpugate.core.classes import PriorityClass
from gpugate.core.placement import PlacementRule, Placing
from gpugate.runtimes.answers import (
    Classified,
    HealthSignal,
    JobEnd,
    LoadedModel,
    Measured,
    NotSupported,
    ReclaimRule,
    Screening,
    Vetted,
)
from gpugate.runtimes.dialect import BodyCoding, ServerDialect
from gpugate.runtimes.process import ProcessControl
from gpugate.runtimes.replies import BodyLimit, ErrorReply


class ModelSettings:
    """The consumer's configuration for a model: every runtime shares these lookups."""

    consumer: Consumer

    def __init__(self, consumer: Consumer) -> None:
        self.consumer = consumer
        self._overrides = {self.model_key(m.name): m for m in consumer.models}
        self._seen: dict[str, ModelOverride | None] = {}

    def model_key(self, name: str) -> str:
        """The gate's key for a model name as a client or the configuration writes it."""
        return name

    def override(self, model: str) -> ModelOverride | None:
        """The consumer's per-model settings for this model, if any."""
        # Looked up several times per request: remember by the name as clients write it.
        try:
            return self._seen[model]
        except KeyError:
            found = self._overrides.get(self.model_key(model))
            if len(self._seen) < 4096:
                self._seen[model] = found
            return found

    def residency(self, model: str) -> Residency:
        """The model's residency, else the consumer's."""
        override = self.override(model)
        return override.residency if override and override.residency else self.consumer.residency

    def model_priority(self, model: str) -> PriorityClass:
        """The model's class, else the consumer's."""
        override = self.override(model)
        return override.priority if override and override.priority else self.consumer.priority

    def configured_envelope(self, model: str) -> int | None:
        """The bytes consumers.yaml gives this model, if any."""
        override = self.override(model)
        return override.envelope if override and override.envelope else None

    def reload_seconds(self, model: str, nbytes: int) -> float:
        """Configured reload time, else a guess from the size (about 2 GiB/s from disk)."""
        override = self.override(model)
        if override and override.reload_seconds is not None:
            return override.reload_seconds
        return 1.0 + nbytes / (2 * 1024**3)

    def url(self, path: str) -> str:
        """The upstream's address for a path."""
        return self.consumer.upstream.url + path


class RequestReading(abc.ABC):
    """How the runtime's server reads a request, and which requests may load a model."""

    consumer: Consumer

    pool_connections: ClassVar[bool] = True
    """Upstream connections may be kept and reused; False opens one per request (a
    runtime whose idle connections close sooner than the gate would notice)."""

    dialect: ClassVar[ServerDialect] = ServerDialect.GO
    """The HTTP server the runtime is built on: how it frames, expects and decodes a
    request (dialect.py). The default is the strictest reading."""

    body_limit: ClassVar[BodyLimit] = BodyLimit()
    """The most request body the runtime's server reads, and its answer past it: the gate's
    default bound for a body it reads (none: the gate's own), refused as the runtime would."""

    def screen(self, method: str, headers: Mapping[str, str], *, target: str = "") -> Screening:
        """The runtime's own checks (Host, Origin) as it would run them where the gate listens.

        `target` is the request-target as the client wrote it (origin-form `/api/tags?x=1`,
        or absolute-form `http://host/api/tags`): some runtimes take the Host from it.
        """
        return Screening()

    def decoded_coding(self, path: str, content_encoding: str) -> BodyCoding | None:
        """A content coding the runtime undoes on this route before reading the body (beyond
        what its HTTP server undoes on every route: `dialect`); None: read it as sent."""
        return None

    @abc.abstractmethod
    def wants_body(self, method: str, path: str) -> bool:
        """Must the body be read to classify this request?"""

    @abc.abstractmethod
    def classify(
        self, method: str, path: str, body: bytes | None, content_type: str, *, query: str = ""
    ) -> Classified:
        """Whether a request may put a model in VRAM, under which lease scope, and its body
        (`query`: the URL's raw query string, for runtimes that read fields from it)."""

    vets: bool = False
    """Whether `vet` asks the runtime anything (the listener calls it for demands only then)."""

    async def vet(
        self, classified: Classified, session: aiohttp.ClientSession, now: float
    ) -> Vetted | None:
        """The runtime's own refusal of a demand, decided from what the runtime says of
        itself (ComfyUI's node catalog, an Ollama model's capabilities) before any lease;
        None: admit it. May raise the session's errors or AdapterError: the demand is then
        admitted unvetted."""
        return None


class ResidentControl(abc.ABC):
    """What the runtime holds, and how it gives memory back."""

    consumer: Consumer

    reconcilable: ClassVar[bool] = False
    """The runtime's listing names its memory (its unknown memory gets a name soon)."""

    reclaim_rule: ClassVar[ReclaimRule] = ReclaimRule()

    @abc.abstractmethod
    async def listing(self, session: aiohttp.ClientSession) -> list[LoadedModel]:
        """What the runtime holds; raises NotSupported when it cannot say (NVML decides)."""

    @abc.abstractmethod
    async def evict(self, session: aiohttp.ClientSession, model: str) -> None:
        """Ask the runtime to give a resident's memory back (unload, free, stop)."""

    async def estimate(
        self, session: aiohttp.ClientSession, model: str, options: str
    ) -> int | None:
        """Bytes a model will take before it was ever measured; None: the runtime lacks it."""
        raise NotSupported(f"{self.consumer.name} cannot size {model} before it is loaded")

    @property
    def most_models(self) -> int | None:
        """The most models the runtime holds at once, past which it unloads one of its own
        choosing to load another (`Demand.most_models`); None: no such limit."""
        return None

    def evict_timeout(self) -> float:
        """How long an eviction may take (a process's stop takes its stop timeout)."""
        return self.consumer.timeouts.control


class JobControl:
    """A runtime that queues jobs: their names, sizes, ends and interruption."""

    consumer: Consumer

    def job_key(self, classified: Classified, body: bytes) -> str | None:
        """The runtime's name for the job a JOB request started, read from its answer."""
        return None

    sizes_requests: ClassVar[bool] = False
    """Whether `size` reads requests; the gate works out a ceiling only for those that do."""

    def size(
        self, classified: Classified, measured: Measured | None, ceiling: int | None
    ) -> int | None:
        """Bytes for a demand the adapter sizes from its body (None: configured, measured or
        estimated by model); `ceiling` is the most the card can give the consumer."""
        return None

    tracks_jobs: ClassVar[bool] = False
    """Its JOB leases end by `track_jobs`: the gate polls it while the consumer has jobs."""

    async def track_jobs(
        self, session: aiohttp.ClientSession, live: frozenset[str]
    ) -> list[JobEnd]:
        """Which of the live jobs (by the runtime's names) the runtime no longer has."""
        raise NotSupported(f"{self.consumer.name} cannot say when its jobs end")

    async def preempt(self, session: aiohttp.ClientSession, job: str) -> None:
        """Stop a running job for a demand of a class the consumer lets preempt it."""
        raise NotSupported(f"{self.consumer.name} cannot stop a job")


class ProcessLife:
    """A runtime whose memory is its process's, from start to exit."""

    process: ProcessControl | None = None
    """The runtime's process when the gate starts and stops it (its memory is the
    process's, from start to exit); None for a runtime the gate only talks to."""

    def needs_process(self, method: str, path: str) -> bool:
        """Does this request need the runtime's process running (a process runtime: the
        gate starts it for such a request, and counts it busy while it runs)?

        One that does not (a read of the runtime's page or its models) is forwarded as it
        is while the process runs, neither starting it nor keeping it warm. While the gate
        keeps the process stopped, its health route is answered by the gate (`up_health`)
        and any other request starts it: only the runtime can answer it."""
        return True

    def up_health(self, method: str = "GET") -> ErrorReply:
        """What the runtime answers on its health route (`control.health`) to `method` (GET
        or HEAD) once it is up: the gate answers it in the runtime's place while it keeps
        the process stopped (a request that needs the process starts it, so the service is
        there). The default is the body and type whisper-server and llama-server answer
        (200 `{"status":"ok"}`, `application/json`); a runtime gives its own headers."""
        return ErrorReply(200, b'{"status":"ok"}', "application/json")

    def process_model(self) -> str | None:
        """The name the process's memory goes by (its current model); None when the
        runtime's memory is not a process's held from start to exit.

        For such a runtime a PROCESS-scope demand of a request is a switch of the running
        process's model (`Demand.switch`, whisper-server's /load), which the runtime
        answers once the new model is loaded: the answer ends its lease."""
        return None

    def loaded_by(self, classified: Classified, status: int) -> bool:
        """Whether the runtime's answer `status` to a request that may load (a DEMAND)
        says the load took effect: the gate then counts the model loaded (a switch
        done), and `answered` follows the same rule. The default: any status below 400."""
        return status < 400

    def answered(self, classified: Classified, status: int) -> None:
        """The runtime answered a request with `status` (a model switch took effect when
        `loaded_by` says so)."""
        return None

    def refused_after_load(self, classified: Classified, status: int, body: bytes) -> bool:
        """Whether the runtime's 5xx answer (`body`: its first bytes) to a request that
        may load is its own refusal of the request once the model was loaded: the model is
        resident and nothing failed to load. False (the default): the load failed."""
        return False

    def process_ended(self) -> None:
        """The process stopped or died: the next one starts as its command says."""
        return None

    def read_unit_command(self, argv: list[str]) -> None:
        """The command line the process's systemd unit runs, as systemd reports it."""
        return None


class GpuPlacement:
    """Where the runtime's loads go among its consumer's GPUs (`gpus:`)."""

    placing: ClassVar[Placing] = Placing.GATE
    """GATE: the gate picks the GPU (a process runtime is started on it); RUNTIME: the
    runtime picks by `placement_rule`."""

    def placement_rule(self, classified: Classified) -> PlacementRule | None:
        """The runtime's own rule for where this request's load goes (RUNTIME placing);
        None: the gate cannot predict it."""
        return None


class HealthCheck(abc.ABC):
    """What says the runtime is there and answering."""

    reconcilable: ClassVar[bool]

    @property
    def health_signal(self) -> HealthSignal:
        """What the gate's health reads for this consumer: a reconcilable runtime is listed
        anyway, so its listing says it answers; others name their own signal."""
        return HealthSignal.LISTING if self.reconcilable else HealthSignal.UNOBSERVED

    @abc.abstractmethod
    async def health(self, session: aiohttp.ClientSession) -> bool:
        """Whether the runtime answers as a healthy one does."""
