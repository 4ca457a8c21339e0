"""A consumer: one managed runtime's listener, upstream, memory and its parts' settings."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, ClassVar, TypeVar

import attrs

from gpugate.config.addresses import Address, Upstream
from gpugate.config.fields import BY_NAME, CLASS_KEY, DURATION, RUNTIME, SECTION, SIZE, STRING_MAP
from gpugate.config.filesizes import FilePattern
from gpugate.core.classes import PriorityClass, ResidencyPolicy

if TYPE_CHECKING:
    from gpugate.config.findings import Findings

DEFAULT_MAX_BODY = 64 * 1024**2
"""The gate's own bound on a body it reads, for a runtime whose server sets none."""


@attrs.frozen
class RuntimeSettings:
    """A runtime's own section of a consumer: each runtime package that has settings of its
    own subclasses it (an attrs class), and registers it by the runtime's name."""

    jobs: ClassVar[bool] = False
    """Whether the runtime queues jobs (a consumer's `preempt` applies to them)."""
    places_itself: ClassVar[bool] = False
    """Whether the runtime spreads its loads over several GPUs by a rule of its own the gate
    predicts (a consumer may list `gpus:` for it without a `control.command`)."""
    controlled: ClassVar[bool] = True
    """Whether the gate may start and stop the runtime's process (`control`): a runtime
    whose memory is its process's. A server whose models load and unload inside it
    (Ollama, ComfyUI) is started by its operator; nothing reads a `control` for it."""
    one_device: ClassVar[bool] = False
    """Whether the runtime runs on one device only, whoever starts it (ComfyUI's
    --cuda-device): a consumer gives it one `gpu`."""

    def check(self, consumer: Consumer, path: str, findings: Findings) -> None:
        """The runtime's own rules across its section and the consumer's other fields
        (`path`: the consumer's)."""
        return None


S = TypeVar("S", bound=RuntimeSettings)


@attrs.frozen
class ProcessMatch:
    """How PIDs seen by NVML are attributed to a consumer or an external service.

    A process matches when its cgroup names one of `units`, or its command line contains
    one of `commands`, or its name (comm) equals one of `names`; a process whose
    ancestor matches belongs to the same owner (Ollama's runners are its children).
    """

    units: tuple[str, ...] = ()
    commands: tuple[str, ...] = ()
    names: tuple[str, ...] = ()

    @property
    def empty(self) -> bool:
        return not (self.units or self.commands or self.names)


@attrs.frozen
class Residency:
    """How long a model stays in VRAM after its last request."""

    policy: ResidencyPolicy = ResidencyPolicy.KEEP_WARM
    ttl: float | None = attrs.field(default=None, metadata=DURATION)
    """Idle time before unload; keep_warm only (defaults to 5m there)."""

    @property
    def idle_ttl(self) -> float | None:
        """Seconds a model may stay idle: None means forever (always_warm)."""
        if self.policy is ResidencyPolicy.ALWAYS_WARM:
            return None
        if self.policy is ResidencyPolicy.LOAD_ON_DEMAND:
            return 0.0
        return 300.0 if self.ttl is None else self.ttl


@attrs.frozen
class ModelOverride:
    """Per-model settings of a consumer; anything unset falls back to the consumer's."""

    name: str
    priority: PriorityClass | None = attrs.field(default=None, metadata=CLASS_KEY)
    residency: Residency | None = None
    """Replaces the consumer's residency as a whole (policy and ttl) for this model."""
    envelope: int | None = attrs.field(default=None, metadata=SIZE)
    """VRAM the model takes when loaded (weights + KV cache + runtime overhead)."""
    reload_seconds: float | None = attrs.field(default=None, metadata=DURATION)
    """How long a reload takes; cheaper-to-reload models are evicted first."""
    rewarm: bool | None = None
    """Load it again, with nobody asking, once the memory it was evicted from for a higher
    class returns while its ttl had time left (`gpugate.core.rewarm`). None: the policy's
    default, on for always_warm and off for keep_warm; load_on_demand never."""

    def rewarms(self, residency: Residency) -> bool:
        """Whether the model is warmed again under `residency`, its own or its consumer's."""
        if residency.policy is ResidencyPolicy.LOAD_ON_DEMAND:
            return False
        if self.rewarm is not None:
            return self.rewarm
        return residency.policy is ResidencyPolicy.ALWAYS_WARM


@attrs.frozen
class FileSize:
    """VRAM a model file takes once loaded, by its name or a glob (gpugate.config.filesizes)."""

    pattern: FilePattern
    size: int = attrs.field(metadata=SIZE)


@attrs.frozen
class UpstreamTimeouts:
    """Bounds on every call the gate makes to a runtime; one that passes fails as TIMEOUT."""

    connect: float = attrs.field(default=5.0, metadata=DURATION)
    """Opening a connection to the upstream."""
    first_byte: float = attrs.field(default=330.0, metadata=DURATION)
    """From sending a request to the response's headers. A load may take the runtime's
    own load timeout (Ollama: OLLAMA_LOAD_TIMEOUT, 5 minutes) before the first byte."""
    idle: float = attrs.field(default=300.0, metadata=DURATION)
    """Longest silence between two chunks of a response body."""
    control: float = attrs.field(default=10.0, metadata=DURATION)
    """The gate's own calls: listings (/api/ps), unloads, sizing (/api/tags, /api/show)."""


@attrs.frozen
class ListenerLimits:
    """What one client connection may take from a listener before it is dropped."""

    header_timeout: float = attrs.field(default=10.0, metadata=DURATION)
    """From a request's first byte (or the connection's opening) to its complete headers."""
    body_timeout: float = attrs.field(default=60.0, metadata=DURATION)
    """From a request's headers to the last byte of its body."""
    idle_timeout: float = attrs.field(default=75.0, metadata=DURATION)
    """How long a keep-alive connection may sit between requests."""
    send_timeout: float = attrs.field(default=60.0, metadata=DURATION)
    """How long a client may take none of what the gate writes to it (the answer waits on
    it); then its connection is closed and its request's lease released."""
    max_connections: int = 1024
    """Open client connections at once; when full, the connection idle longest between
    requests is closed to make room, and only when none is idle is one more refused (503)."""
    max_connections_per_client: int | None = None
    """Open connections from one client address at once (None: all but an eighth of
    `max_connections`); past it the client's own idle connection is closed, or the new one
    refused."""
    upstream_connections: int = 1024
    """Connections to the runtime at once (requests in flight); a request past them waits
    for one to come free, within the connect timeout. Idle client connections hold none."""

    def per_client(self, max_connections: int) -> int:
        """The connections one client address may hold on a listener that takes
        `max_connections` (its cap after the open-files limit)."""
        per_client = self.max_connections_per_client
        if per_client is None:
            # Loopback clients all share one address, so the default only keeps an eighth
            # of the listener for the others.
            per_client = max(1, max_connections - max(1, max_connections // 8))
        return min(per_client, max_connections)


@attrs.frozen
class ProcessControlSettings:
    """How the gate starts and stops a runtime that holds its model until it exits.

    Either `unit` (a systemd service, driven with systemctl) or `command` (run by the gate
    as its own child), never both.
    """

    unit: str | None = None
    """A systemd unit: `systemctl start/stop/is-active UNIT`."""
    command: tuple[str, ...] = ()
    """The program and its arguments, one list item each (no shell)."""
    env: tuple[tuple[str, str], ...] = attrs.field(default=(), metadata=STRING_MAP)
    """Variables added to the gate's environment for `command`."""
    cwd: Path | None = None
    """Working directory of `command`."""
    health: str = "/health"
    """Path that answers 200 once the runtime can serve (after its port accepts)."""
    start_timeout: float = attrs.field(default=60.0, metadata=DURATION)
    """From the start to a 200 from `health`; a start that passes it is stopped."""
    stop_timeout: float = attrs.field(default=10.0, metadata=DURATION)
    """From SIGTERM (or `systemctl stop`) to the process gone; then SIGKILL."""
    start_admission_timeout: float = attrs.field(default=120.0, metadata=DURATION)
    """How long a start lease (`gpugate admit`) waits for NVML to show the process holding
    its envelope; a lease still waiting then is released with LEASE_TIMEOUT."""


@attrs.frozen
class Consumer:
    """A managed runtime: the gate listens on `listen` and forwards to `upstream`."""

    name: str
    runtime: str = attrs.field(metadata=RUNTIME)
    """The runtime's name, one of the runtime table the file is loaded with
    (config/runtime_table.py)."""
    listen: Address
    upstream: Upstream
    gpu: int = 0
    """The GPU its memory is on (0: the first)."""
    gpus: tuple[int, ...] = ()
    """Several GPUs it may use, instead of `gpu`: where a runtime places a model among
    them is its own rule (Ollama) or the gate's choice at start (CUDA_VISIBLE_DEVICES for a
    process runtime)."""
    priority: PriorityClass = attrs.field(default=PriorityClass.INTERACTIVE, metadata=CLASS_KEY)
    residency: Residency = Residency()
    envelope: int | None = attrs.field(default=None, metadata=SIZE)
    """Default VRAM per model (or for the whole runtime when it has no models)."""
    queue_limit: int = 32
    """Tickets this consumer may have waiting at once; one more is QUEUE_FULL."""
    max_body: int | None = attrs.field(default=None, metadata=SIZE)
    """Largest request body the gate will read to classify or rewrite; None: the runtime's
    own limit (`body_limit`)."""
    processes: ProcessMatch = ProcessMatch()
    models: tuple[ModelOverride, ...] = attrs.field(default=(), metadata=BY_NAME)
    timeouts: UpstreamTimeouts = UpstreamTimeouts()
    limits: ListenerLimits = ListenerLimits()
    preempt: tuple[PriorityClass, ...] = ()
    """Job runtimes: classes whose requests may interrupt a running job (none by default)."""
    control: ProcessControlSettings | None = None
    """Start/stop of a runtime that frees its VRAM only by exiting (whisper-server)."""
    settings: RuntimeSettings = attrs.field(factory=RuntimeSettings, metadata=SECTION)
    """The runtime's own section (`comfyui:`, `ollama:`, `vllm:`), of the type the runtime
    table gives its runtime (its package's settings)."""

    @property
    def cards(self) -> tuple[int, ...]:
        """The GPUs it may use, in the order given (`gpus`, else `gpu` alone)."""
        return self.gpus or (self.gpu,)

    def settings_as(self, cls: type[S]) -> S:
        """The runtime's section as `cls` (its defaults when the file has none)."""
        return self.settings if isinstance(self.settings, cls) else cls()

    def body_limit(self, runtime_limit: int | None) -> int:
        """The most request body the gate reads: `max_body` when set, else the limit of the
        runtime's own server, else DEFAULT_MAX_BODY (never unbounded)."""
        if self.max_body is not None:
            return self.max_body
        return DEFAULT_MAX_BODY if runtime_limit is None else runtime_limit

    def model(self, name: str) -> ModelOverride | None:
        """The override for model `name`, if this consumer has one."""
        for override in self.models:
            if override.name == name:
                return override
        return None
