"""The configuration as typed, frozen attrs classes.

Every field's meaning is documented in docs/configuration.md. Field metadata tells the
loader (gpugate.config.loader) how the YAML is spelled:

* `kind`: how to read a scalar: "size" ("7.5GiB", "1216348160"), "duration" ("15m", "901s"),
  "token" (a literal, "env:NAME", "file:PATH", "credential:NAME" or "credential:NAME:PATH"),
  "scope" (a control token's scope), "cors_origin" (a header value: "*" or an origin);
  "control_token" is a token or a mapping `{token, scopes}` (TokenEntry), read as a
  ControlToken.
* `yaml`: the key's name in the file when it differs from the field's (`class:` for `priority`).
* `keyed_by`: a tuple written as a YAML mapping whose keys fill this field of each entry
  (`consumers: {ollama: {...}}` fills `Consumer.name`).
* `value_of`: with `keyed_by`, each entry's value is a scalar filling this field
  (`files: {ae.safetensors: 320MiB}` fills `FileSize.pattern` and `FileSize.size`).

Defaults here are the defaults a user gets when a key is absent.
"""

from __future__ import annotations

import enum
import ipaddress
import re
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar, TypeVar
from urllib.parse import urlsplit

import attrs

from gpugate.config.filesizes import FilePattern
from gpugate.core.classes import PriorityClass, ResidencyPolicy
from gpugate.core.units import GiB

if TYPE_CHECKING:
    from gpugate.config.findings import Findings

SIZE = {"kind": "size"}
DURATION = {"kind": "duration"}
TOKEN = {"kind": "token"}
CONTROL_TOKEN = {"kind": "control_token"}
SCOPE = {"kind": "scope"}
STRING_MAP = {"kind": "string_map"}
CORS_ORIGIN = {"kind": "cors_origin"}
RUNTIME = {"kind": "runtime"}
SECTION = {"section_of": "runtime"}
CLASS_KEY = {"yaml": "class"}
MAX_CLASS_KEY = {"yaml": "max_class"}
BY_NAME = {"keyed_by": "name"}
BY_CLASS = {"keyed_by": "priority"}
BY_PATTERN = {"keyed_by": "pattern", "value_of": "size"}

DEFAULT_MAX_BODY = 64 * 1024**2
"""The gate's own bound on a body it reads, for a runtime whose server sets none."""

_LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
_HOSTNAME = re.compile(rf"{_LABEL}(?:\.{_LABEL})*")


@attrs.frozen
class RuntimeSettings:
    """A runtime's own section of a consumer: each runtime package that has settings of its
    own subclasses it (an attrs class), and registers it by the runtime's name."""

    jobs: ClassVar[bool] = False
    """Whether the runtime queues jobs (a consumer's `preempt` applies to them)."""
    places_itself: ClassVar[bool] = False
    """Whether the runtime spreads its loads over several GPUs by a rule of its own the gate
    predicts (a consumer may list `gpus:` for it without a `control.command`)."""
    one_device: ClassVar[bool] = False
    """Whether the runtime runs on one device only, whoever starts it (ComfyUI's
    --cuda-device): a consumer gives it one `gpu`."""

    def check(self, consumer: Consumer, path: str, findings: Findings) -> None:
        """The runtime's own rules across its section and the consumer's other fields
        (`path`: the consumer's)."""
        return None


S = TypeVar("S", bound=RuntimeSettings)


def _check_host(host: str, written: object) -> str:
    """`host` if it is an IP address or a DNS name, else ValueError quoting `written`."""
    try:
        return str(ipaddress.ip_address(host))
    except ValueError:
        pass
    if host.replace(".", "").isdigit() or not _HOSTNAME.fullmatch(host):
        raise ValueError(f"{host!r} in {written!r} is not an IP address or host name")
    return host


def _check_port(port: object, written: object) -> int:
    if isinstance(port, str):
        if not (port.isascii() and port.isdigit()):
            raise ValueError(f"expected a port number in {written!r}, got {port!r}")
        port = int(port)
    if not isinstance(port, int) or not 1 <= port <= 65535:
        raise ValueError(f"port {port} in {written!r} is outside 1-65535")
    return port


@attrs.frozen
class Address:
    """A listen address: "0.0.0.0:11434", "127.0.0.1:9411", "[::1]:8188" or ":8188"."""

    host: str
    port: int

    def __str__(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"

    @classmethod
    def parse(cls, value: str | int) -> Address:
        """Read "host:port", "[v6]:port", ":port" or a bare port (all interfaces: 0.0.0.0)."""
        if isinstance(value, int) and not isinstance(value, bool):
            return cls("0.0.0.0", _check_port(value, value))
        text = value.strip()
        host, colon, port = text.rpartition(":")
        if not colon and not text.isdigit():
            raise ValueError(f"expected an address like '0.0.0.0:11434', got {value!r}")
        if host.startswith("[") and host.endswith("]"):
            host = host[1:-1]
            if ":" not in host:
                raise ValueError(f"brackets are for IPv6 addresses, got {value!r}")
        elif ":" in host:
            raise ValueError(f"write an IPv6 address in brackets, like '[::1]:8188', got {value!r}")
        port_number = _check_port(port, value)
        return cls(_check_host(host, value) if host else "0.0.0.0", port_number)

    @property
    def reaches_loopback(self) -> bool:
        """Whether a connection to 127.0.0.1 (or ::1) on this port lands on this listener."""
        if self.host in ("0.0.0.0", "::", "localhost"):
            return True
        try:
            return ipaddress.ip_address(self.host).is_loopback
        except ValueError:
            return False


@attrs.frozen
class Upstream:
    """Where the real runtime listens: "http://127.0.0.1:11435"."""

    scheme: str
    host: str
    port: int

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{self.scheme}://{host}:{self.port}"

    @classmethod
    def parse(cls, text: str) -> Upstream:
        """Read "http://127.0.0.1:11435"; the port defaults to the scheme's (80, 443)."""
        example = "like 'http://127.0.0.1:11435'"
        parts = urlsplit(text.strip())
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"expected an http:// or https:// URL {example}, got {text!r}")
        extras = [
            what
            for what, present in (
                ("a user name", parts.username is not None),
                ("a path", parts.path not in ("", "/")),
                ("a query", bool(parts.query)),
                ("a fragment", bool(parts.fragment)),
            )
            if present
        ]
        if extras:
            raise ValueError(f"an upstream is scheme://host:port only, {text!r} has {extras[0]}")
        try:
            port = parts.port
        except ValueError:
            raise ValueError(f"expected a port number in {text!r}") from None
        if port is None:
            port = 443 if parts.scheme == "https" else 80
        host = _check_host(parts.hostname, text)
        return cls(parts.scheme, host, _check_port(port, text))

    @property
    def is_loopback(self) -> bool:
        """Whether the runtime is reachable only from this host (127.0.0.0/8, ::1, localhost)."""
        if self.host == "localhost":
            return True
        try:
            return ipaddress.ip_address(self.host).is_loopback
        except ValueError:
            return False


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
