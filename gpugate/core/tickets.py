"""Demands, tickets and leases: a request's claim on VRAM from arrival to release."""

from __future__ import annotations

import enum

import attrs

from gpugate.core.classes import PriorityClass, ResidencyPolicy
from gpugate.core.failures import FailureClass
from gpugate.core.residents import ResidentKey


class LeaseScope(enum.Enum):
    """How long a lease lives, and which event ends it."""

    REQUEST = "request"
    """Ends with the request that asked for it (its response ends or its client leaves)."""
    JOB = "job"
    """Outlives the request that queued a job; ends with the job (`GateCore.job_done`).
    A consumer's jobs share one lease, sized to the largest live job."""
    PROCESS = "process"
    """A process that allocates at start: the lease becomes a resident once NVML shows the
    consumer holding its bytes, and fails if that does not happen within `appear_within`.
    A `switch` of a running process's model ends with the runtime's answer instead."""


class Sizing(enum.Enum):
    """How a load takes its memory, as far as the free memory it sees goes
    (`gpugate.core.floors`)."""

    FIXED = "fixed"
    """What its model and options say, whatever the card has free."""
    FITS_FREE = "fits_free"
    """Fitted by its runtime to the memory it sees free when it loads, up to its ceiling:
    bytes leased to another load and not yet allocated look free to it."""


@attrs.frozen
class Degraded:
    """A demand granted its floor because its ceiling could not be had in time
    (`gpugate.core.floors`). Sizes in the request's own terms (a job's own size)."""

    floor: int
    """What it is granted: the least its runtime runs it in."""
    ceiling: int
    """What it asked for: its envelope."""
    reason: FailureClass
    """What the ceiling met: INSUFFICIENT_SCHEDULABLE_VRAM (more than could ever be freed),
    DEADLINE_CANNOT_BE_MET (not before its maximum wait), LEASE_TIMEOUT (still not at it)."""
    why: str
    """The ceiling's refusal, as it would have been worded."""


@attrs.frozen
class Started:
    """A job its runtime accepted before its lease (it alone could judge it), so it may be
    running, and taking memory, while its lease is planned.

    `unexplained` is, per GPU, what its consumer's last sample showed beyond the books when
    the job went up: memory the samples show beyond that since is taken to be the job's
    own (`gpugate.core.early`)."""

    unexplained: tuple[tuple[int, int], ...] = ()

    def before(self, gpu: int) -> int:
        """What the consumer held beyond the books on `gpu` before the job went up."""
        return next((nbytes for index, nbytes in self.unexplained if index == gpu), 0)


@attrs.frozen
class Demand:
    """What a runtime's reading says a request needs before it may be forwarded."""

    key: ResidentKey
    gpu: int
    envelope: int
    """Bytes the model takes once loaded; leased in full when it is not resident (the
    ceiling of a runtime whose loads degrade)."""
    priority: PriorityClass
    """The request's class: decides its place in the queue and whom it may evict."""
    resident_priority: PriorityClass
    """The model's class once loaded: decides who may evict it."""
    policy: ResidencyPolicy
    idle_ttl: float | None
    reload_seconds: float = 1.0
    sets_ttl: bool = True
    """The request sets the model's idle time; otherwise it keeps whatever was set before
    (Ollama's keep_alive is sticky, and /v1 requests cannot carry one)."""
    max_wait: float | None = None
    """Seconds it may wait for its lease; None: its class's `max_wait`."""
    lease_ttl: float | None = None
    """An explicit lease (work that is not a request): it lapses unless renewed within this
    many seconds. None: a request's lease, which ends with its request."""
    scope: LeaseScope = LeaseScope.REQUEST
    appear_within: float | None = None
    """PROCESS scope: seconds the process has to show its memory in NVML."""
    replaces: ResidentKey | None = None
    """A resident the runtime frees itself before this load (whisper-server's /load): its
    bytes count as this demand's, and it leaves the books when the lease is granted."""
    switch: bool = False
    """PROCESS scope: a request that switches the model of the running process (whisper-
    server's /load), which the runtime answers once the new model is loaded. Its answer
    ends the lease, whatever NVML shows (a smaller model never shows the lease's bytes);
    a switch that fails leaves the model it `replaces` where it was."""
    most_models: int | None = None
    """The most models the runtime holds for its consumer at once (llama-server's
    `--models-max`): at that many it unloads one of its own choosing to load another. A
    demand for a model not held, with that many of its consumer's in the books, evicts
    one first (the gate's choice, `gpugate.core.crowding`), so the runtime never unloads
    on its own. None: no such limit."""
    job_bytes: int | None = None
    """JOB scope, set by the core: the job's own size, while `envelope` is what it must
    grow its consumer's job lease by."""
    rewarm: bool = False
    """A model warmed again (`gpugate.core.rewarm`): no client waits for it, so no higher-class
    model yields to it (`yield_after` is for a waiting request) and it never swaps one out."""
    started: Started | None = None
    """JOB scope: the runtime runs the job already (accepted before its lease); None: it
    runs only once leased. See `gpugate.core.early`."""
    floor: int | None = None
    """The least the runtime runs the load in, degraded (a partial load, a context cut to
    fit); None: the envelope, a runtime that cannot degrade. The core
    grants the envelope, and the floor only when the envelope cannot be had by the demand's
    deadline (`gpugate.core.floors`)."""
    sizing: Sizing = Sizing.FIXED
    """Whether its runtime sizes the load to the memory it sees free."""
    degraded: Degraded | None = None
    """Set by the core on a demand planned at its floor: what it asked for, and why not."""

    @property
    def consumer(self) -> str:
        return self.key.consumer

    @property
    def model(self) -> str:
        return self.key.model

    @property
    def explicit(self) -> bool:
        return self.lease_ttl is not None

    @property
    def loads_model(self) -> bool:
        """Whether the runtime answering the request means its model is loaded (a job's
        and a started process's memory shows in NVML later; an explicit lease loads
        nothing; a process's switch is answered once it is done)."""
        return not self.explicit and (self.scope is LeaseScope.REQUEST or self.switch)


@attrs.frozen
class Margin:
    """What a ticket's first eviction plan was made against (`gpugate.core.margins`)."""

    at: float
    victims: tuple[ResidentKey, ...]
    freed: int
    """Bytes the victims held when they were chosen."""
    reserve: int
    external: int
    committed: int
    schedulable: int


class TicketState(enum.Enum):
    WAITING = "waiting"
    GRANTED = "granted"
    FAILED = "failed"
    CANCELLED = "cancelled"


@attrs.define
class Ticket:
    """A demand waiting for a lease, in a per-GPU queue ordered by class then arrival."""

    id: int
    demand: Demand
    arrived: float
    deadline: float
    state: TicketState = TicketState.WAITING
    evicting: tuple[ResidentKey, ...] = ()
    """Residents being unloaded so that this ticket fits; their bytes are earmarked for it."""
    margin: Margin | None = None
    """What its first eviction plan was made against (`gpugate.core.margins`)."""
    allocating: str = ""
    """Why it last waited, when it waited for other leases to allocate (a load that sizes
    itself, `gpugate.core.floors`): said again if it times out."""
    counting_on: tuple[ResidentKey, ...] = ()
    """The residents its last plan waits for (to evict them, or for them to go)."""
    reason: str = ""
    """Why its last plan waits, in words (a yield of a higher-class model included)."""
    overtaken: int = 0
    """How many later demands were served from a resident it counts on (`gpugate.core.swaps`)."""

    def order(self) -> tuple[int, int, float, int]:
        """Queue order: a job its runtime already runs first (`gpugate.core.early`), then
        highest class first, then arrival, then id."""
        demand = self.demand
        return (int(demand.started is None), -int(demand.priority), self.arrived, self.id)


@attrs.define
class Lease:
    """The right to have a request in flight: `pending` bytes not yet visible as a resident."""

    id: int
    demand: Demand
    granted: float
    waited: float
    pending: int
    """Bytes leased for a load that has not completed; 0 once materialised or when resident."""
    loads: bool
    """True when this lease loads the model (it was not resident when granted)."""
    expires_at: float | None = None
    """An explicit lease lapses at this time unless renewed; None for a request's lease."""
    job_of: int | None = None
    """A job's lease: the id of its consumer's job lease, which carries the bytes."""
    appear_by: float | None = None
    """PROCESS scope: the process must show its memory in NVML by then."""

    @property
    def scope(self) -> LeaseScope:
        return self.demand.scope

    @property
    def key(self) -> ResidentKey:
        return self.demand.key

    @property
    def gpu(self) -> int:
        return self.demand.gpu
