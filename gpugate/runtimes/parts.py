"""The parts a runtime may have, each a small interface of its own.

A runtime is a record of its parts (runtime.py): how its requests are read, how it takes
memory and gives it back, how it is known to be well, and, where it has them, its own
refusals, its listing, its jobs, its process and its placement among GPUs. A part it
lacks is None there, and nowhere else: no flag beside a method, no method that raises for
a runtime that lacks it. Each part of the gate takes the part it
uses (the listener: `Reading`; the unload runner: `Residents`, `Inventory`, `Lifecycle`).

A part that needs state another part of the same runtime keeps (whisper-server's current
model, a router's catalog) is handed that state when its runtime is built.
"""

from __future__ import annotations

import abc
from collections.abc import Mapping
from typing import Protocol

import aiohttp

from gpugate.core.classes import PriorityClass
from gpugate.core.placement import PlacementRule, Placing
from gpugate.core.residents import ResidentKey
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
from gpugate.runtimes.footprint import Cap, Cards, Elasticity, Footprint
from gpugate.runtimes.keepalive import KEEP, KeepAlivePolicy
from gpugate.runtimes.process import ProcessControl
from gpugate.runtimes.replies import BodyLimit, ErrorReply


class Reading(abc.ABC):
    """How the runtime's server reads a request, which requests may load a model, and what
    its answer to one says."""

    dialect: ServerDialect = ServerDialect.GO
    """The HTTP server the runtime is built on: how it frames, expects and decodes a
    request (dialect.py). The default is the strictest reading."""

    body_limit: BodyLimit = BodyLimit()
    """The most request body the runtime's server reads, and its answer past it: the gate's
    default bound for a body it reads (none: the gate's own), refused as the runtime would."""

    keep_alive: KeepAlivePolicy = KEEP
    """How long the runtime's server keeps a connection, and so how the gate may reuse one
    (keepalive.py)."""

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

    def loaded_by(self, classified: Classified, status: int) -> bool:
        """Whether the runtime's answer `status` to a request that may load (a DEMAND) says
        the load took effect: the gate then counts the model loaded (a switch done), and a
        process runtime's current model follows the same rule. The default: any status
        below 400."""
        return status < 400

    def refused_after_load(self, classified: Classified, status: int, body: bytes) -> bool:
        """Whether the runtime's 5xx answer (`body`: its first bytes) to a request that
        may load is its own refusal of the request once the model was loaded: the model is
        resident and nothing failed to load. False (the default): the load failed."""
        return False


class Vetting(abc.ABC):
    """The runtime's own refusal of a demand, asked before any lease."""

    @abc.abstractmethod
    async def vet(
        self, classified: Classified, session: aiohttp.ClientSession, now: float
    ) -> Vetted | None:
        """The runtime's own refusal of a demand, decided from what the runtime says of
        itself (ComfyUI's node catalog, an Ollama model's capabilities) before any lease;
        None: admit it. May raise the session's errors or AdapterError: the demand is then
        admitted unvetted."""


class Residents(abc.ABC):
    """How the runtime gives a resident's memory back, and how the gate confirms it."""

    reclaim_rule: ReclaimRule = ReclaimRule()

    @abc.abstractmethod
    async def evict(self, session: aiohttp.ClientSession, model: str) -> None:
        """Ask the runtime to give a resident's memory back (unload, free)."""

    @abc.abstractmethod
    def evict_timeout(self) -> float:
        """How long an eviction may take (a process's stop takes its stop timeout)."""

    warms: bool = False
    """Whether the runtime loads a model when asked with nothing to run (`warm`): how the
    gate loads again a model evicted for a higher class (`gpugate.core.rewarm`)."""

    async def warm(self, session: aiohttp.ClientSession, model: str, ttl: float | None) -> None:
        """Ask the runtime to load a model and keep it `ttl` seconds idle (None: until it is
        unloaded); returns once the runtime answers that it is loaded. Only where `warms`."""
        raise NotImplementedError(f"{type(self).__name__} cannot load a model when asked")

    def warm_timeout(self) -> float:
        """How long a load asked by `warm` may take."""
        return self.evict_timeout()

    @property
    def most_models(self) -> int | None:
        """The most models the runtime holds at once, past which it unloads one of its own
        choosing to load another (`Demand.most_models`, llama-server's `--models-max`);
        None: no such limit."""
        return None


class Inventory(abc.ABC):
    """A listing that names the runtime's memory: the books follow it (its unknown memory
    gets a name soon)."""

    @abc.abstractmethod
    async def listing(self, session: aiohttp.ClientSession) -> list[LoadedModel]:
        """What the runtime holds."""


class Jobs(abc.ABC):
    """A runtime that queues jobs and says when they end: their names, ends and
    interruption. Its JOB leases end by `track_jobs`, which the gate polls while the
    consumer has jobs."""

    def job_key(self, classified: Classified, body: bytes) -> str | None:
        """The runtime's name for the job a JOB request started, read from its answer
        (None: the lease's id names it)."""
        return None

    @abc.abstractmethod
    async def track_jobs(
        self, session: aiohttp.ClientSession, live: frozenset[str]
    ) -> list[JobEnd]:
        """Which of the live jobs (by the runtime's names) the runtime no longer has."""

    @abc.abstractmethod
    async def preempt(self, session: aiohttp.ClientSession, job: str) -> None:
        """Stop a job (a running one, or one waiting in the runtime's queue)."""


class Bounds(Protocol):
    """What the gate knows that bounds a demand a runtime sizes from its request."""

    def measured_job(self, kind: ResidentKey) -> Measured | None:
        """The peak measured for earlier jobs of this kind, if any."""
        ...


class Configured(Protocol):
    """The consumer's configuration of a model's bytes (`ModelSettings`)."""

    def configured_envelope(self, model: str) -> int | None: ...


class Memory:
    """How the runtime takes memory for a load, and what a load takes before the gate
    measured one: configured, read from the request, or from the model itself. Every
    runtime has one; the gate sizes every demand through it, and nothing else.

    Written from each runtime's source (its package's `memory` module, docs/runtimes/):
    whether a load is fixed or fitted to what the runtime sees free (`elasticity`), the
    least it runs in and the most it takes (`Footprint`), and the knob that tells it the
    most it may take (`cap`). This class itself is the memory of a runtime the gate knows
    only by its configuration."""

    elasticity: Elasticity = Elasticity.FIXED
    knob: str = ""
    """The runtime's own name for what `cap` sets (`--gpu-memory-utilization`), for the
    operator; empty: it has none."""

    def __init__(self, settings: Configured) -> None:
        self.settings = settings

    def configured(self, model: str) -> int | None:
        """The bytes the configuration gives the model (consumers.yaml's `envelope`)."""
        return self.settings.configured_envelope(model)

    def size(
        self, classified: Classified, kind: ResidentKey, priority: PriorityClass, bounds: Bounds
    ) -> Footprint | None:
        """What a demand takes, read from its request (ComfyUI's prompt); None: sized by its
        model (configured, measured, else `estimate`)."""
        return None

    def read(self, model: str, cards: Cards) -> Footprint | None:
        """What a load of `model` takes, from its file as the gate reads it on this host
        (no call to the runtime); None: the gate cannot tell that way."""
        return None

    async def estimate(
        self, session: aiohttp.ClientSession, model: str, options: str, cards: Cards
    ) -> Footprint | None:
        """What a first load of `model` with runner `options` takes, from the model itself,
        on `cards`; None: the runtime does not know the model (it will refuse the request
        without loading anything). Raises NotSupported when the runtime cannot say."""
        found = self.read(model, cards)
        if found is None:
            raise NotSupported(f"{model}: its runtime says nothing of a model before it loads")
        return found

    def cap(self, model: str, nbytes: int, cards: Cards) -> Cap | None:
        """How to tell the runtime a load of `model` may hold at most `nbytes` on `cards`;
        None: it has no knob for it (its load is what its model takes)."""
        return None


class Lifecycle(abc.ABC):
    """A runtime whose memory is its process's, from start to exit: the process's model,
    and the control the gate starts and stops it with."""

    control: ProcessControl | None
    """The runtime's process when the gate starts and stops it; None for one the gate only
    talks to (its memory is reserved, and never evicted)."""

    @abc.abstractmethod
    def process_model(self) -> str:
        """The name the process's memory goes by (its current model).

        A PROCESS-scope demand of a request is a switch of the running process's model
        (`Demand.switch`, whisper-server's /load), which the runtime answers once the new
        model is loaded: the answer ends its lease."""

    @abc.abstractmethod
    def needs_process(self, method: str, path: str) -> bool:
        """Does this request need the runtime's process running (the gate starts it for
        such a request, and counts it busy while it runs)?

        One that does not (a read of the runtime's page or its models) is forwarded as it
        is while the process runs, neither starting it nor keeping it warm. While the gate
        keeps the process stopped, its health route is answered by the gate (`up_health`)
        and any other request starts it: only the runtime can answer it."""

    @abc.abstractmethod
    def up_health(self, method: str = "GET") -> ErrorReply:
        """What the runtime answers on its health route (`control.health`) to `method` (GET
        or HEAD) once it is up: the gate answers it in the runtime's place while it keeps
        the process stopped."""

    @abc.abstractmethod
    def answered(self, classified: Classified, status: int) -> None:
        """The runtime answered a request with `status` (a model switch took effect when
        its reading's `loaded_by` says so)."""

    @abc.abstractmethod
    def process_ended(self) -> None:
        """The process stopped or died: the next one starts as its command says."""

    @abc.abstractmethod
    def read_unit_command(self, argv: list[str]) -> None:
        """The command line the process's systemd unit runs, as systemd reports it."""


class Placement(abc.ABC):
    """The runtime's own rule for where its loads go among its consumer's GPUs (`gpus:`).
    A runtime without one is placed by the gate (a process runtime is started there)."""

    @abc.abstractmethod
    def placement_rule(self, classified: Classified) -> PlacementRule | None:
        """Where this request's load goes; None: the gate cannot predict it."""


def placing(placement: Placement | None) -> Placing:
    """Who picks the GPU of a runtime's loads: the runtime by its rule, else the gate."""
    return Placing.GATE if placement is None else Placing.RUNTIME


class Health(abc.ABC):
    """What says the runtime is there and answering."""

    signal: HealthSignal
    """What the gate's health reads for this consumer: its listing, its health route, its
    process, or nothing (`check` is then never asked)."""

    @abc.abstractmethod
    async def check(self, session: aiohttp.ClientSession) -> bool:
        """Whether the runtime answers as a healthy one does."""
