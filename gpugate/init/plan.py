"""From what was recognised to what to write: names, ports, classes, envelopes, controls.

Only what runs in init's own network and PID namespaces is proposed, and what the operator
names (`--pid`): a runtime in another network namespace listens on that namespace's
addresses, and moving it to loopback would cut off its clients (namespaces.py). The gate
takes the address each runtime listens on now (its clients change nothing; a runtime on
every address is fronted on every address) and the runtime moves to loopback, on the next
port up that nothing listens on (11434 → 11435, as the shipped drop-ins do). A runtime that
loads its model at start and holds it until it exits (whisper-server, llama-server with one
model) is admitted at start, as the shipped whisper-server drop-in does (`gpugate admit ...
-- COMMAND` as its ExecStart), and the gate controls its unit.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import shlex
from collections.abc import Mapping, Sequence
from pathlib import Path

import attrs

from gpugate.core.units import GiB, MiB, parse_size
from gpugate.init.handstart import HandStart, env_path
from gpugate.init.recognise import (
    Address,
    Found,
    Recognised,
    comfyui_base,
    has_flag,
    option,
    program_of,
)
from gpugate.init.scan import HostScan, LoadedModel, UnitInfo, comfyui_model_files, redact
from gpugate.runtimes.comfyui.adapter import reserve_vram
from gpugate.runtimes.footprint import Cap
from gpugate.runtimes.vllm.adapter import utilization_cap

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
MODEL_FILE_OVERHEAD = 1.25
"""A model file's size times this is the envelope guessed for a process holding nothing now
(weights plus compute buffers and a CUDA context); measured at its first start."""


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
        return _show(address.host, address.port)


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


def _show(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def mib(nbytes: int) -> int:
    """Whole MiB, rounded up."""
    return -(-nbytes // MiB)


def gib(nbytes: int) -> str:
    return f"{nbytes / GiB:.1f} GiB"


def present(root: Path, path: str) -> bool:
    """Whether `path` (absolute, as the moves name it) is there under `root`; a path that
    cannot be looked at counts as there, so that nothing unseen is replaced."""
    try:
        os.lstat(root / path.lstrip("/"))
    except (FileNotFoundError, NotADirectoryError):
        return False
    except OSError:
        return True
    return True


def gate_host(host: str) -> tuple[str, str]:
    """(the address the gate listens on in the runtime's place, a note or "")."""
    if host in ("", "*", "localhost"):
        return ("0.0.0.0", "") if host != "localhost" else ("127.0.0.1", "")
    try:
        ip = ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return (
            "0.0.0.0",
            f"it was told to listen on {host!r}, a name: the gate listens on every address",
        )
    if ip.is_unspecified:
        if ip.version == 4:
            return "0.0.0.0", ""
        return "0.0.0.0", (
            "it listened on [::] (IPv6, and IPv4 through it): the gate listens on 0.0.0.0, "
            "IPv4 only"
        )
    return (f"[{ip}]" if ip.version == 6 else str(ip)), ""


def with_address(argv: Sequence[str], found: Found, port: int) -> tuple[str, ...]:
    """`argv` with the runtime's host and port options set to 127.0.0.1 and `port`."""
    rule = found.rule
    words = list(argv)
    for names, value in ((rule.host_options, "127.0.0.1"), (rule.port_options, str(port))):
        if not names:
            continue
        replaced = False
        i = 0
        while i < len(words):
            word = words[i]
            if word in names:
                following = words[i + 1] if i + 1 < len(words) else None
                if following is not None and not following.startswith("-"):
                    words[i + 1] = value
                else:
                    words.insert(i + 1, value)
                replaced = True
                i += 2
                continue
            if any(word.startswith(name + "=") for name in names if name.startswith("--")):
                words[i] = f"{word.split('=', 1)[0]}={value}"
                replaced = True
            i += 1
        if not replaced:
            words += [names[0], value]
    return tuple(words)


class _Ports:
    """Ports taken: what listens now, what the gate takes, what was handed out."""

    def __init__(self, in_use: frozenset[int], reserved: set[int]) -> None:
        self.taken = set(in_use) | reserved

    def next_free(self, after: int) -> int:
        port = after + 1
        while port in self.taken or port > 65535:
            port = port + 1 if port < 65535 else 1024
        self.taken.add(port)
        return port


def _model_file(found: Found) -> tuple[Path | None, int | None]:
    model = found.model
    if not model:
        return None, None
    path = Path(model)
    if not path.is_absolute():
        if found.process.cwd is None:
            return path, None
        path = found.process.cwd / path
    try:
        return path, path.stat().st_size
    except OSError:
        return path, None


def _process_envelope(found: Found) -> tuple[int | None, str]:
    """A process runtime's envelope: what it holds now, else its model file's size."""
    if found.bytes_now:
        where = ", ".join(f"GPU {g}" for g in found.gpus)
        return mib(found.bytes_now) * MiB, f"held now ({where}, NVML)"
    path, size = _model_file(found)
    if size:
        guess = int(size * MODEL_FILE_OVERHEAD)
        return mib(guess) * MiB, (
            f"not on the card now: {MODEL_FILE_OVERHEAD:g} x its model file ({path}, "
            f"{mib(size)} MiB); the gate measures it at its next start"
        )
    return None, ""


def _vllm_envelope(found: Found, scan: HostScan, gpu: int) -> tuple[int | None, str]:
    if found.bytes_now:
        return mib(found.bytes_now) * MiB, "held now (NVML)"
    share = option(found.args, ["--gpu-memory-utilization"]) or "0.9"
    device = next((d for d in scan.devices if d.index == gpu), None)
    try:
        fraction = float(share)
    except ValueError:
        fraction = 0.9
    if device is None:
        return None, ""
    return mib(int(device.total * fraction)) * MiB, (
        f"not on the card now: --gpu-memory-utilization {share} of GPU {gpu}"
    )


def _vllm_share(envelope: int, scan: HostScan, gpu: int) -> Cap | None:
    """`--gpu-memory-utilization`: the share of its card `envelope` is (None: no card)."""
    device = next((d for d in scan.devices if d.index == gpu), None)
    return utilization_cap(envelope, device.total) if device is not None else None


def _command_match(found: Found) -> tuple[str, ...]:
    """The string its processes' command lines contain (attribution's `commands`)."""
    program = found.program
    if found.kind == "ollama":
        return ("ollama serve",)
    if found.kind == "vllm":
        return ("vllm serve",) if program.module is None else (program.module,)
    if found.kind == "llama" and "/" not in program.word:
        # A bare `llama-server` would also match other programs' children named so (some
        # Ollama builds name their runners llama-server): the next word narrows it.
        args = found.args
        return (f"{program.word} {args[0]}",) if args else (program.word,)
    return (program.word,)


def _embedding(found: Found) -> bool:
    args = found.args
    if found.kind == "llama":
        return has_flag(args, ["--embedding", "--embeddings", "--reranking", "--rerank"])
    if found.kind == "vllm":
        return option(args, ["--task"]) in ("embed", "embedding", "score", "classify") or (
            option(args, ["--runner"]) == "pooling"
        )
    return False


def make_plan(
    scan: HostScan,
    recognised: Recognised,
    units: Mapping[str, UnitInfo],
    options: Options,
    loaded: Mapping[int, tuple[list[LoadedModel], str]] | None = None,
) -> Plan:
    """Decide every consumer, external service and port. `loaded`: what each Ollama (by
    PID) said it holds."""
    loaded = loaded or {}
    notes: list[str] = []
    left_out: list[tuple[Found, str]] = []
    in_use = scan.ports_in_use
    listening: list[tuple[Found, Address]] = []
    named = {pid for found in recognised.runtimes for pid in found.members} & options.named
    for pid in sorted(options.named - named):
        process = scan.processes.get(pid)
        what = (
            "no such process" if process is None else f"{process.command} is no runtime init knows"
        )
        notes.append(f"--pid {pid}: {what}")
    for found in recognised.runtimes:
        where = found.process.namespaces.elsewhere(scan.own)
        if where and not named & set(found.members):
            left_out.append(
                (
                    found,
                    f"it runs {where}: its addresses are that namespace's, not this one's; "
                    f"name it (--pid {found.process.pid}) to propose it all the same",
                )
            )
            continue
        if found.address is None:
            left_out.append((found, "no address: it listens on no socket init can see"))
            continue
        listening.append((found, found.address))
    # Two processes on one port (SO_REUSEPORT, or a second instance): the first is fronted.
    seen_ports: dict[int, Found] = {}
    fronted: list[tuple[Found, Address]] = []
    for found, address in listening:
        other = seen_ports.get(address.port)
        if other is not None:
            left_out.append(
                (
                    found,
                    f"it listens on port {address.port} too, as {other.kind} "
                    f"pid {other.process.pid}",
                )
            )
            continue
        seen_ports[address.port] = found
        fronted.append((found, address))
    listen_ports = set(seen_ports)
    if options.control is not None:
        control = options.control
    else:
        port = DEFAULT_CONTROL_PORT
        while port in in_use or port in listen_ports:
            port += 1
        control = f"127.0.0.1:{port}"
        if port != DEFAULT_CONTROL_PORT:
            notes.append(f"port {DEFAULT_CONTROL_PORT} is taken: the control listener is {control}")
    control_port = int(control.rpartition(":")[2])
    ports = _Ports(in_use, listen_ports | {control_port})
    kinds = [found.kind for found, _ in fronted]
    default_gpu = scan.devices[0].index if scan.devices else 0
    fronts: list[Front] = []
    for found, address in fronted:
        name = found.kind if kinds.count(found.kind) == 1 else f"{found.kind}-{address.port}"
        front = _front(name, found, address, scan, units, ports, default_gpu, loaded, options)
        if isinstance(front, str):
            left_out.append((found, front))
        else:
            fronts.append(front)
    services = []
    ext_kinds = [found.kind for found in recognised.external]
    for found in recognised.external:
        name = (
            found.kind if ext_kinds.count(found.kind) == 1 else f"{found.kind}-{found.process.pid}"
        )
        unit = found.process.unit if not found.process.user_unit else None
        services.append(Service(name, found, unit))
    for process in scan.processes.values():
        program = program_of(process.argv)
        if (
            program is not None
            and program.name == "gpugate"
            and (program.args(process.argv)[:1] == ("serve",))
        ):
            notes.append(
                f"a gate already runs here (pid {process.pid}, {process.command}): what init "
                "proposes fronts the runtimes where they listen now, which may be behind it; "
                "compare with the configuration it serves"
            )
    if scan.nvml_error and not scan.devices:
        notes.append(
            f"NVML could not be read ({scan.nvml_error}): no GPU, no memory per process, no "
            "envelope from what runtimes hold"
        )
    elif scan.nvml_error:
        notes.append(f"NVML: {scan.nvml_error}")
    targets = [CONFIG_PATH, CONTROL_TOKEN, ADMIT_TOKEN, GATE_UNIT_PATH] + [
        front.drop_in.install_path
        for front in fronts
        if front.drop_in is not None and not front.drop_in.user_unit
    ]
    return Plan(
        scan=scan,
        recognised=recognised,
        options=options,
        fronts=tuple(fronts),
        services=tuple(services),
        control=control,
        left_out=tuple(left_out),
        notes=tuple(notes),
        present=frozenset(t for t in targets if present(options.root, t)),
    )


def _ollama_gpus(found: Found, scan: HostScan) -> tuple[int, ...]:
    """The cards an Ollama may load on when there are several: every card when its
    environment hides none (no CUDA_VISIBLE_DEVICES), else those it holds memory on."""
    if found.kind != "ollama":
        return ()
    if len(scan.devices) > 1 and "CUDA_VISIBLE_DEVICES" not in found.env:
        return tuple(sorted(d.index for d in scan.devices))
    return tuple(sorted(found.gpus)) if len(found.gpus) > 1 else ()


def _front(
    name: str,
    found: Found,
    address: Address,
    scan: HostScan,
    units: Mapping[str, UnitInfo],
    ports: _Ports,
    default_gpu: int,
    loaded: Mapping[int, tuple[list[LoadedModel], str]],
    options: Options,
) -> Front | str:
    """One consumer, or why it is left out."""
    notes: list[str] = []
    host, host_note = gate_host(address.host)
    if host_note:
        notes.append(host_note)
    upstream_port = ports.next_free(address.port)
    gpu = found.gpus[0] if found.gpus else default_gpu
    gpus = _ollama_gpus(found, scan)
    if gpus:
        notes.append(
            "Ollama sees GPUs "
            + ", ".join(map(str, gpus))
            + " and places each model on one of them (or splits it) by its own rule; "
            "the gate leases where Ollama will load"
        )
    elif len(found.gpus) > 1:
        notes.append(
            "it holds memory on GPUs "
            + ", ".join(map(str, found.gpus))
            + f"; budgeted on GPU {gpu}, where it holds the most"
        )
    process = found.process
    unit = process.unit
    info = units.get(unit) if unit is not None else None
    movable = process.container is None and process.namespaces.same_net
    if process.container is not None:
        notes.append(
            f"it runs in a container ({process.container}): publish its port on "
            f"127.0.0.1:{upstream_port} instead of {address.port} (docker run -p "
            f"127.0.0.1:{upstream_port}:{address.port}); init writes no drop-in for it"
        )
    elif not process.namespaces.same_net:
        notes.append(
            f"it runs {process.namespaces.elsewhere(scan.own)}, proposed as named: the "
            f"address shown is in its namespace, and the gate, in this one, reaches it only "
            f"where that namespace's port is forwarded here; forward it to "
            f"127.0.0.1:{upstream_port} instead of {address.port}. Init writes no drop-in "
            "and no restart for it"
        )
    notes += _other_addresses(found, address, host)
    klass = "background" if _embedding(found) else "interactive"
    values: dict = dict(
        name=name,
        found=found,
        listen_host=host,
        listen_port=address.port,
        upstream_port=upstream_port,
        gpu=gpu,
        gpus=gpus,
        klass=klass,
        commands=_command_match(found),
        unit=unit if movable else None,
        unit_info=info,
    )
    kind = found.kind
    if kind == "ollama":
        values.update(policy="keep_warm", ttl="15m")
        values["new_env"] = (
            ("OLLAMA_HOST", f"127.0.0.1:{upstream_port}"),
            ("OLLAMA_KEEP_ALIVE", "-1"),
        )
        origins = found.env.get("OLLAMA_ORIGINS", "")
        values["origins"] = tuple(o.strip() for o in origins.split(",") if o.strip())
        models, why = loaded.get(process.pid, ([], ""))
        values["models"] = tuple(models)
        values["models_note"] = why
        for_unit = info.environment if info is not None else {}
        if (
            "OLLAMA_HOST" in found.env
            and "OLLAMA_HOST" not in for_unit
            and info is not None
            and info.known
        ):
            files = ", ".join(info.environment_files) or "not the unit's Environment="
            notes.append(
                f"OLLAMA_HOST={found.env['OLLAMA_HOST']} comes from elsewhere ({files}): an "
                "EnvironmentFile= wins over the drop-in's Environment=; change it there"
            )
    elif kind == "comfyui":
        values.update(policy="load_on_demand")
        base = comfyui_base(process, found.program)
        files: list[tuple[str, int]] = []
        if base is not None and (base / "models").is_dir():
            files = comfyui_model_files(base / "models")
            values["files_note"] = f"sizes on disk in {base / 'models'}"
        else:
            where = base / "models" if base is not None else "its models folder (cwd unreadable)"
            values["files_note"] = f"{where} could not be read"
            notes.append(
                f"ComfyUI's model files could not be sized ({where}): give their sizes "
                "in files, or every file a prompt loads counts as 8 GiB"
            )
        values["files"] = tuple(files)
        if has_flag(found.args, ["--enable-cors-header"]):
            values["cors_header"] = option(found.args, ["--enable-cors-header"], flag_value="*")
        upload = option(found.args, ["--max-upload-size"])
        if upload is not None:
            with contextlib.suppress(ValueError):
                values["max_body"] = int(float(upload) * MiB)
    elif kind == "whisper":
        envelope, why = _process_envelope(found)
        values.update(policy="always_warm", envelope=envelope, envelope_note=why)
    elif kind == "llama":
        one_model = has_flag(
            found.args, ["-m", "--model", "-hf", "--hf-repo", "-mu", "--model-url"]
        )
        if one_model:
            envelope, why = _process_envelope(found)
            if envelope is None:
                return (
                    "llama-server with one model holds nothing on the card now and its model "
                    "file could not be read: its envelope is unknown"
                )
            values.update(policy="always_warm", envelope=envelope, envelope_note=why)
        else:
            values.update(policy="keep_warm", ttl="15m")
    elif kind == "vllm":
        envelope, why = _vllm_envelope(found, scan, gpu)
        if envelope is None:
            return "vLLM needs an envelope and NVML showed no card to size it from"
        values.update(envelope=envelope, envelope_note=why)
        if has_flag(found.args, ["--enable-sleep-mode"]):
            values.update(policy="keep_warm", ttl="15m")
            if found.env.get("VLLM_SERVER_DEV_MODE") != "1":
                values["new_env"] = (("VLLM_SERVER_DEV_MODE", "1"),)
        else:
            values.update(policy="always_warm")
            notes.append(
                "vLLM runs without --enable-sleep-mode: the gate cannot take its memory back "
                "(its eviction is a sleep); add the flag and VLLM_SERVER_DEV_MODE=1 to evict it"
            )
    # How it starts after the move: its unit's command (or its own), address changed.
    base_argv: tuple[str, ...] = process.argv
    if info is not None and info.known and info.exec_start:
        base_argv = info.exec_start
        unit_program = program_of(base_argv)
        if unit_program is None or unit_program.name != found.program.name:
            notes.append(
                f"{unit} runs {shlex.join(redact(base_argv))}, which started "
                f"{process.command}: the drop-in replaces the unit's command with the "
                "runtime's own; check it, or move the address where the unit's command sets it"
            )
            base_argv = process.argv
    elif unit is not None and movable:
        why = info.error if info is not None and info.error else "systemd does not know it"
        notes.append(f"systemctl show {unit}: {why}; the drop-in uses the running command line")
    if kind != "ollama" and movable:
        values["new_argv"] = with_address(base_argv, found, upstream_port)
        if kind == "comfyui":
            # ComfyUI sizes its loads to the free memory less this (partial loads, Dynamic
            # VRAM): it must leave the gate's reserve free, as the gate does.
            values["new_argv"] = COMFYUI_RESERVE.onto(values["new_argv"], {}).argv
        elif kind == "vllm":
            # vLLM takes this share of the card's total at start, whatever its version's
            # default: the envelope the gate leases it, unless its command says its own.
            share = _vllm_share(values["envelope"], scan, gpu)
            if share is not None:
                values["new_argv"] = share.onto(values["new_argv"], {}).argv
    envelope_known = values.get("envelope") is not None
    if process.user_unit and kind == "llama" and values["policy"] == "always_warm":
        return (
            f"a one-model llama-server in a user unit ({unit}): the gate starts and stops only "
            "system units and its own children; run it as a system unit"
        )
    if unit is not None and movable and not process.user_unit:
        values["admitted"] = (
            kind in ("whisper", "llama") and envelope_known and (values["policy"] == "always_warm")
        )
    elif (
        kind == "llama" and values["policy"] == "always_warm" and movable and values.get("new_argv")
    ):
        # A one-model llama-server is controlled as a process: outside systemd, the gate
        # runs it as its child.
        values["control_command"] = values["new_argv"]
        notes.append(
            "it runs outside systemd: the gate starts it itself (control.command); stop this "
            "one, and the gate starts it on the first request"
        )
    if process.user_unit:
        notes.append(
            f"{unit} is a user unit: install the drop-in as its user and use systemctl --user"
        )
    if movable and unit is None:
        hand = HandStart(
            name, process, env_path(options.out, name) if process.env is not None else None
        )
        values["hand"] = hand
        if not values.get("control_command"):
            notes += hand.notes()
    front = Front(**values, notes=tuple(notes))
    if front.unit is not None:
        front = attrs.evolve(front, drop_in=_drop_in_for(front))
    return front


def _other_addresses(found: Found, address: Address, taken: str) -> list[str]:
    """A note when the runtime listens on more addresses than the one the gate takes, and
    a client of one of them would be cut off."""
    others = sorted(
        {
            _show(li.host, li.port)
            for li in found.listeners
            if li.port == address.port
            and li.host != address.host
            and not (taken == "0.0.0.0" and ":" not in li.host)
        }
    )
    if not others:
        return []
    return [
        f"it also listens on {', '.join(others)}: the gate takes {taken}:{address.port} "
        "only, and a client that connects there now gets no answer once it moves"
    ]


def _drop_in_for(front: Front) -> DropIn:
    assert front.unit is not None
    info = front.unit_info
    later = tuple(
        os.path.basename(path)
        for path in (info.drop_in_paths if info is not None else ())
        if os.path.basename(path) > DROP_IN and os.path.basename(path) != LATE_DROP_IN
    )
    return DropIn(
        front.unit,
        LATE_DROP_IN if later else DROP_IN,
        later,
        user_unit=front.found.process.user_unit,
    )
