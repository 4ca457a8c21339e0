"""The configuration as typed, frozen attrs classes: the whole file and its gate-wide sections.

Every field's meaning is documented in docs/configuration.md; how each is spelled in the
YAML is its metadata (gpugate.config.fields). A consumer and its parts are in
gpugate.config.consumer, listen and upstream addresses in gpugate.config.addresses; both
are re-exported here, where most of the gate imports them from.

Defaults here are the defaults a user gets when a key is absent.
"""

from __future__ import annotations

import enum
import ipaddress
from pathlib import Path

import attrs

from gpugate.config.addresses import Address, Upstream
from gpugate.config.consumer import (
    DEFAULT_MAX_BODY,
    Consumer,
    FileSize,
    ListenerLimits,
    ModelOverride,
    ProcessControlSettings,
    ProcessMatch,
    Residency,
    RuntimeSettings,
    UpstreamTimeouts,
)
from gpugate.config.fields import (
    BY_CLASS,
    BY_NAME,
    CLASS_KEY,
    CONTROL_TOKEN,
    DURATION,
    MAX_CLASS_KEY,
    SCOPE,
    SIZE,
    TOKEN,
)
from gpugate.core.classes import PriorityClass
from gpugate.core.units import GiB

__all__ = [
    "ALL_SCOPES",
    "DEFAULT_MAX_BODY",
    "DEFAULT_MAX_WAIT",
    "Address",
    "BudgetSettings",
    "ClassSettings",
    "Config",
    "Consumer",
    "ControlToken",
    "ExternalService",
    "FileSize",
    "GateSettings",
    "GpuSettings",
    "Identity",
    "ListenerLimits",
    "ModelOverride",
    "ProcessControlSettings",
    "ProcessMatch",
    "QueueSettings",
    "Residency",
    "RuntimeSettings",
    "Scope",
    "TokenEntry",
    "Upstream",
    "UpstreamTimeouts",
    "default_classes",
    "token_scopes",
]


@attrs.frozen
class ExternalService:
    """A GPU user the gate does not manage (Plex, Tdarr): observed, never controlled."""

    name: str
    processes: ProcessMatch = ProcessMatch()


@attrs.frozen
class ClassSettings:
    """Queueing rules of one priority class."""

    priority: PriorityClass
    max_wait: float = attrs.field(metadata=DURATION)
    """Longest a ticket of this class waits for a lease before LEASE_TIMEOUT."""


@attrs.frozen
class Identity:
    """A client identity by source address or bearer token, mapped to a class."""

    name: str
    priority: PriorityClass = attrs.field(metadata=CLASS_KEY)
    sources: tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...] = ()
    tokens: tuple[str, ...] = attrs.field(default=(), metadata=TOKEN)
    max_priority: PriorityClass | None = attrs.field(default=None, metadata=MAX_CLASS_KEY)
    """Highest class the X-GPUGate-Priority header may ask for (default: `priority`)."""


class Scope(enum.Enum):
    """What a control token may do on the control API (gpugate.control.auth.ROUTE_SCOPES)."""

    ADMIT = "admit"
    """Ask for a process runtime's start lease (`gpugate admit`)."""
    LEASE = "lease"
    """Ask for, renew and release explicit leases (`gpugate lease`)."""
    OPERATE = "operate"
    """Evict, drain and undrain, pause and resume."""
    READ = "read"
    """Every GET (status, events, leases, metrics, the dashboard) when reads are not public."""

    @classmethod
    def parse(cls, text: str) -> Scope:
        """Read a scope name; ValueError naming the known ones otherwise."""
        try:
            return cls(text.strip().lower())
        except ValueError:
            known = ", ".join(s.value for s in cls)
            raise ValueError(f"unknown scope {text!r} (one of {known})") from None


ALL_SCOPES = frozenset(Scope)
"""What a bare `control_tokens` entry grants: everything."""


class ControlToken(str):
    """A control token: the text a client presents as `Authorization: Bearer`, carrying the
    scopes it grants. It is its text wherever a token is used as text (compared, sent,
    checked for duplicates); a bare entry, or a plain str given in code, grants every scope.
    """

    scopes: frozenset[Scope]

    def __new__(cls, text: str, scopes: frozenset[Scope] | tuple[Scope, ...] = ALL_SCOPES):
        token = super().__new__(cls, text)
        token.scopes = frozenset(scopes)
        return token


def token_scopes(token: str) -> frozenset[Scope]:
    """The scopes a control token grants: its own, or all of them for a plain str."""
    return getattr(token, "scopes", ALL_SCOPES)


@attrs.frozen
class TokenEntry:
    """A `gate.control_tokens` entry written as a mapping: the token and what it may do."""

    token: str = attrs.field(metadata=TOKEN)
    scopes: tuple[Scope, ...] = attrs.field(default=tuple(Scope), metadata=SCOPE)


@attrs.frozen
class GpuSettings:
    """Settings of one GPU, by NVML index."""

    index: int
    reserve: int | None = attrs.field(default=None, metadata=SIZE)
    """Safety margin on this GPU (default: budget.reserve)."""


@attrs.frozen
class BudgetSettings:
    """How the VRAM budget is sampled and how much of it is held back."""

    reserve: int = attrs.field(default=GiB, metadata=SIZE)
    """Bytes kept free on every GPU on top of everything counted."""
    reserve_max: int = attrs.field(default=2 * GiB, metadata=SIZE)
    """Ceiling the reserve may grow to when external use is volatile."""
    sample_interval: float = attrs.field(default=0.5, metadata=DURATION)
    """How often NVML memory and processes are sampled."""
    stale_after: float = attrs.field(default=5.0, metadata=DURATION)
    """A sample older than this cannot admit anything (SCHEDULER_STATE_STALE)."""
    reclaim_timeout: float = attrs.field(default=5.0, metadata=DURATION)
    """How long an eviction may take to show up in NVML before GPU_MEMORY_NOT_RECLAIMED."""


@attrs.frozen
class GateSettings:
    """The gate's own listener, storage and process settings."""

    control: Address = Address("127.0.0.1", 9411)
    """Control listener: /metrics and /gate/v1/."""
    database: Path | None = None
    """SQLite file for events, lease history and measured envelopes (None: in memory)."""
    shutdown_grace: float = attrs.field(default=30.0, metadata=DURATION)
    """How long in-flight streams may run on after a shutdown signal."""
    proc_root: Path = Path("/proc")
    """Where process attribution reads /proc/<pid>/{cgroup,cmdline,comm,status}."""
    nvml_library: Path | None = None
    """Load this libnvidia-ml.so.1 instead of the system one."""
    control_tokens: tuple[ControlToken, ...] = attrs.field(default=(), metadata=CONTROL_TOKEN)
    """Bearer tokens of the control API (`env:NAME`, `file:PATH`, `credential:NAME[:PATH]`),
    each with the scopes it grants (every scope for a bare entry)."""
    control_public: bool | None = None
    """Read-only control routes and /metrics without a token; None: only on loopback."""
    history_retention: float = attrs.field(default=30 * 86400.0, metadata=DURATION)
    max_lease_ttl: float = attrs.field(default=3600.0, metadata=DURATION)
    """The longest `ttl` a lease request may ask for: how long an explicit lease's bytes
    stay leased after its holder stops renewing it (it died without releasing)."""
    agent_check: Address | None = None
    """HAProxy agent-check responder: one line per connection (`up ready 75%`, `drain 0%`,
    `maint 0%`) from the numbers of /gate/v1/capacity; None: not served."""


@attrs.frozen
class QueueSettings:
    """How the queue weighs waiting requests against the models loaded (docs/configuration.md,
    `gpugate.core.swaps`)."""

    equal_class_grace: float = attrs.field(default=10.0, metadata=DURATION)
    """An idle model may be evicted for a request of its own class only after this long
    idle (a model just used is likely used again)."""
    yield_after: float = attrs.field(default=15.0, metadata=DURATION)
    """An idle `keep_warm` (or `load_on_demand`) model of a higher class below production is
    evicted for a waiting lower-class request once idle this long, before its TTL ends. Set
    it past your longest TTL to keep such models for their whole TTL."""
    swap_hold: float = attrs.field(default=20.0, metadata=DURATION)
    """A request for a loaded model is served ahead of an earlier one of its class that
    waits to evict that model only while the earlier one has waited less than this (or
    half its max_wait, if that is shorter)."""
    swap_overtakes: int = 8
    """... and been overtaken fewer times than this; 0: first come, first served."""
    swap_window: float = attrs.field(default=300.0, metadata=DURATION)
    """A model evicted for a request and loaded again within this is counted a swap
    (`gpugate_swaps_total`)."""


DEFAULT_MAX_WAIT = {
    PriorityClass.PRODUCTION: 600.0,
    PriorityClass.INTERACTIVE: 120.0,
    PriorityClass.BACKGROUND: 1800.0,
    PriorityClass.BENCHMARK: 3600.0,
    PriorityClass.MAINTENANCE: 21600.0,
}


def default_classes() -> tuple[ClassSettings, ...]:
    """Every class with its default max_wait, highest first."""
    return tuple(ClassSettings(p, DEFAULT_MAX_WAIT[p]) for p in PriorityClass.ordered())


@attrs.frozen
class Config:
    """The whole consumers.yaml."""

    source: Path | None = None
    gate: GateSettings = GateSettings()
    budget: BudgetSettings = BudgetSettings()
    gpus: tuple[GpuSettings, ...] = ()
    classes: tuple[ClassSettings, ...] = attrs.field(factory=default_classes, metadata=BY_CLASS)
    queue: QueueSettings = QueueSettings()
    identities: tuple[Identity, ...] = ()
    consumers: tuple[Consumer, ...] = attrs.field(default=(), metadata=BY_NAME)
    external: tuple[ExternalService, ...] = attrs.field(default=(), metadata=BY_NAME)

    def consumer(self, name: str) -> Consumer:
        """The consumer called `name`; KeyError if there is none."""
        for consumer in self.consumers:
            if consumer.name == name:
                return consumer
        raise KeyError(name)

    def class_settings(self, priority: PriorityClass) -> ClassSettings:
        """Queueing rules of `priority` (its defaults when the file leaves it out)."""
        for settings in self.classes:
            if settings.priority is priority:
                return settings
        return ClassSettings(priority, DEFAULT_MAX_WAIT[priority])

    def reserve_for(self, gpu: int) -> int:
        """The reserve on GPU `gpu`: its own setting, else budget.reserve."""
        for settings in self.gpus:
            if settings.index == gpu and settings.reserve is not None:
                return settings.reserve
        return self.budget.reserve
