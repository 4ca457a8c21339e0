"""The plan `gpugate init` decides: what it was asked, each consumer and external service,
and the files it writes and where they install (planning.py decides it)."""

from __future__ import annotations

from pathlib import Path

import attrs

from gpugate.core.units import GiB, MiB, parse_size
from gpugate.init.addresses import show_address
from gpugate.init.handstart import HandStart
from gpugate.init.recognise import Found, Recognised
from gpugate.init.scan import HostScan, LoadedModel
from gpugate.init.systemd import UnitInfo
from gpugate.runtimes.comfyui.adapter import reserve_vram

BUDGET_RESERVE = "1GiB"
"""The budget's reserve the configuration is written with."""
COMFYUI_RESERVE = reserve_vram(parse_size(BUDGET_RESERVE))
"""ComfyUI's `--reserve-vram`, in GB as it reads them (× 1024³, comfy/model_management.py
`EXTRA_RESERVED_VRAM`): the budget's reserve, which ComfyUI's self-sized loads must leave
free (its default is 0.4 GB on Linux)."""
DEFAULT_CONTROL_PORT = 9411
DEFAULT_DATABASE = "/var/lib/gpugate/gpugate.db"
CONFIG_PATH = "/etc/gpugate/consumers.yaml"
CONTROL_TOKEN = "/etc/gpugate/control.token"
ADMIT_TOKEN = "/etc/gpugate/admit.token"
GATE_UNIT_PATH = "/etc/systemd/system/gpugate.service"
GATE_UNIT_FILE = "gpugate.service"
"""The gate's unit as init writes it under --out: the packaged one, for this gpugate."""
CONFIG_FILE = "consumers.yaml"
MOVES_FILE = "moves.txt"
DROP_IN = "gpugate.conf"
LATE_DROP_IN = "zz-gpugate.conf"
ADMIT_WAIT = "5m"


@attrs.frozen
class Options:
    """What `gpugate init` was asked."""

    out: Path = Path("gpugate-init")
    control: str | None = None
    """The gate's control address; None: 127.0.0.1:9411, or the next free port."""
    database: str = DEFAULT_DATABASE
    proc_root: Path | None = None
    """Written as gate.proc_root when it is not /proc."""
    nvml_library: Path | None = None
    """Written as gate.nvml_library when given."""
    gpugate: str = "/usr/local/bin/gpugate"
    """The gpugate program a drop-in's `gpugate admit` runs."""
    ask_runtimes: bool = True
    """Ask a found Ollama which models it holds (GET /api/ps on loopback)."""
    named: frozenset[int] = frozenset()
    """PIDs the operator named (`--pid`): proposed even when they run in another namespace."""
    root: Path = Path("/")
    """The file system the moves install into: a file already there is never replaced."""


@attrs.frozen
class DropIn:
    """A systemd drop-in for one runtime unit (its text is write.drop_in_text's)."""

    unit: str
    file_name: str
    after: tuple[str, ...] = ()
    """The unit's own drop-ins that sort after gpugate.conf, and so would override it."""
    user_unit: bool = False

    @property
    def path(self) -> str:
        """Where it is written, under --out."""
        return f"{self.unit}.d/{self.file_name}"

    @property
    def install_path(self) -> str:
        if self.user_unit:
            return f"~/.config/systemd/user/{self.unit}.d/{self.file_name}"
        return f"/etc/systemd/system/{self.unit}.d/{self.file_name}"


@attrs.frozen
class Front:
    """One consumer: a runtime the gate will front."""

    name: str
    found: Found
    listen_host: str
    listen_port: int
    upstream_port: int
    gpu: int
    klass: str
    policy: str
    ttl: str | None = None
    gpus: tuple[int, ...] = ()
    """Several cards the runtime places its loads on by its own rule (Ollama); empty:
    it is on `gpu`."""
    envelope: int | None = None
    envelope_note: str = ""
    models: tuple[LoadedModel, ...] = ()
    models_note: str = ""
    files: tuple[tuple[str, int], ...] = ()
    files_note: str = ""
    origins: tuple[str, ...] = ()
    cors_header: str | None = None
    max_body: int | None = None
    commands: tuple[str, ...] = ()
    unit: str | None = None
    unit_info: UnitInfo | None = None
    admitted: bool = False
    """Its start is admitted (`gpugate admit` in its ExecStart, else its ExecStartPre) and the
    gate controls the unit."""
    control_command: tuple[str, ...] = ()
    """The gate runs this itself (a one-model llama-server outside systemd)."""
    new_argv: tuple[str, ...] | None = None
    """The command it runs with after the move (None when only its environment changes)."""
    new_env: tuple[tuple[str, str], ...] = ()
    drop_in: DropIn | None = None
    hand: HandStart | None = None
    """How it is started again when it was started by hand (no unit, no container)."""
    notes: tuple[str, ...] = ()

    @property
    def listen(self) -> str:
        return f"{self.listen_host}:{self.listen_port}"

    @property
    def upstream(self) -> str:
        return f"http://127.0.0.1:{self.upstream_port}"

    @property
    def was(self) -> str:
        address = self.found.address
        assert address is not None
        return show_address(address.host, address.port)


@attrs.frozen
class Service:
    """One external service: observed, never touched."""

    name: str
    found: Found
    unit: str | None


@attrs.frozen
class Plan:
    """Everything `gpugate init` will write, decided."""

    scan: HostScan
    recognised: Recognised
    options: Options
    fronts: tuple[Front, ...]
    services: tuple[Service, ...]
    control: str
    left_out: tuple[tuple[Found, str], ...] = ()
    """Runtimes found but not fronted, and why."""
    notes: tuple[str, ...] = ()
    present: frozenset[str] = frozenset()
    """The files the moves would install that are there already (under `options.root`):
    none is replaced, so that every move can be undone."""

    @property
    def admits(self) -> bool:
        return any(front.admitted for front in self.fronts)


def mib(nbytes: int) -> int:
    """Whole MiB, rounded up."""
    return -(-nbytes // MiB)


def gib(nbytes: int) -> str:
    return f"{nbytes / GiB:.1f} GiB"
