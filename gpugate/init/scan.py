"""Reading a host for `gpugate init`: typed records of what NVML, /proc and systemd show.

Everything here only reads. What cannot be read is left empty and said so (`env is None`,
`cwd is None`, a device list with `nvml_error`), never guessed: another user's
/proc/PID/environ, fd/ and cwd need root (or CAP_SYS_PTRACE), and a container's sockets
live in its own network namespace, which /proc/net/tcp of this one does not list. Each
process's namespaces are compared with init's own (namespaces.py), so that what runs in
another is told apart.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import re
import shlex
import subprocess
from collections.abc import Iterable, Mapping
from pathlib import Path

import attrs

from gpugate.init.namespaces import HERE, Namespaces, OwnNamespaces

LISTEN_STATE = "0A"
"""The state column of a listening socket in /proc/net/tcp{,6}."""
SYSTEMCTL_TIMEOUT = 10.0
UNIT_PROPERTIES = (
    "Id",
    "LoadState",
    "ActiveState",
    "FragmentPath",
    "DropInPaths",
    "ExecStart",
    "Environment",
    "EnvironmentFiles",
    "User",
)
"""What `systemctl show` is asked about each unit a recognised runtime runs in."""


@attrs.frozen
class Device:
    """One card as NVML reports it."""

    index: int
    name: str
    uuid: str
    total: int
    reserved: int
    used: int


@attrs.frozen
class GpuProcess:
    """One PID holding memory on one card (NVML's compute and graphics lists merged)."""

    pid: int
    gpu: int
    used: int | None
    """Bytes, or None where the driver cannot tell."""


@attrs.frozen
class Listener:
    """A listening TCP socket of this network namespace."""

    host: str
    """The address it is bound to, as text ("0.0.0.0", "127.0.0.1", "::")."""
    port: int
    inode: str

    @property
    def is_loopback(self) -> bool:
        return ipaddress.ip_address(self.host).is_loopback

    @property
    def is_any(self) -> bool:
        return ipaddress.ip_address(self.host).is_unspecified


@attrs.frozen
class Process:
    """One process as its /proc directory shows it; empty or None where unreadable."""

    pid: int
    ppid: int | None
    comm: str
    argv: tuple[str, ...]
    env: Mapping[str, str] | None = None
    """None when /proc/PID/environ could not be read (another user's, without root)."""
    cwd: Path | None = None
    unit: str | None = None
    """The innermost systemd service of its cgroup (`ollama.service`), if any."""
    user_unit: bool = False
    """Whether that unit is run by a user's manager (`user@1000.service`), not the system's."""
    container: str | None = None
    """The container it runs in, as its cgroup names it (`docker-3f2a….scope`), if any."""
    sockets: frozenset[str] = frozenset()
    """Inodes of the sockets it holds (None readable: empty)."""
    fds_readable: bool = True
    namespaces: Namespaces = HERE
    """Whether it runs in init's own network and PID namespaces."""
    uid: int | None = None
    """The user it runs as (its real UID), when /proc/PID/status shows it."""

    @property
    def command(self) -> str:
        """Its command line as one string (or `[comm]` when it has none), secrets hidden."""
        return shlex.join(redact(self.argv)) if self.argv else f"[{self.comm}]"


@attrs.frozen
class UnitInfo:
    """What `systemctl show UNIT` says about a unit."""

    name: str
    load_state: str = ""
    active_state: str = ""
    fragment_path: str = ""
    drop_in_paths: tuple[str, ...] = ()
    exec_start: tuple[str, ...] | None = None
    """The argv of its first ExecStart= (drop-ins applied), when systemd showed one."""
    environment: Mapping[str, str] = attrs.field(factory=dict)
    environment_files: tuple[str, ...] = ()
    user: str = ""
    error: str = ""
    """Why it could not be read ("" when it was)."""

    @property
    def known(self) -> bool:
        return not self.error and self.load_state not in ("", "not-found")


@attrs.frozen
class HostScan:
    """Everything `gpugate init` read from a host."""

    hostname: str
    proc_root: Path
    driver_version: str = ""
    devices: tuple[Device, ...] = ()
    gpu_processes: tuple[GpuProcess, ...] = ()
    nvml_error: str = ""
    processes: Mapping[int, Process] = attrs.field(factory=dict)
    listeners: tuple[Listener, ...] = ()
    """The listening sockets of init's own network namespace."""
    own: Namespaces = HERE
    """Init's own namespaces, as /proc shows them (for what it prints)."""

    @property
    def ports_in_use(self) -> frozenset[int]:
        """Every port something listens on in this network namespace."""
        return frozenset(listener.port for listener in self.listeners)

    def listeners_of(self, pid: int) -> list[Listener]:
        """The listening sockets process `pid` holds, lowest port first."""
        process = self.processes.get(pid)
        if process is None:
            return []
        held = [li for li in self.listeners if li.inode in process.sockets]
        return sorted(held, key=lambda li: (li.port, li.host))

    def ancestry(self, pid: int) -> list[Process]:
        """The process and its parents, nearest first (PID 1 and beyond left out)."""
        chain: list[Process] = []
        seen: set[int] = set()
        current = self.processes.get(pid)
        while current is not None and current.pid not in seen and current.pid > 1:
            chain.append(current)
            seen.add(current.pid)
            current = self.processes.get(current.ppid) if current.ppid else None
        return chain


_SECRET_OPTION = re.compile(r"(?i)^--?[a-z0-9-]*(key|token|secret|passw|auth)[a-z0-9-]*$")
HIDDEN = "***"


def redact(argv: Iterable[str]) -> tuple[str, ...]:
    """`argv` with the values of options named like secrets (`--api-key X`,
    `--hf-token=X`) shown as ***, for what init prints about a process."""
    words = list(argv)
    for i, word in enumerate(words):
        name, sep, _ = word.partition("=")
        if not _SECRET_OPTION.match(name):
            continue
        if sep:
            words[i] = f"{name}={HIDDEN}"
        elif i + 1 < len(words) and not words[i + 1].startswith("-"):
            words[i + 1] = HIDDEN
    return tuple(words)


# -- /proc -----------------------------------------------------------------------------


def _read(path: Path) -> bytes | None:
    try:
        with open(path, "rb") as fh:
            return fh.read()
    except OSError:
        return None


def split_cmdline(raw: bytes) -> tuple[str, ...]:
    """/proc/PID/cmdline's words (a rewritten title's NUL padding dropped)."""
    words = raw.decode("utf-8", "replace").split("\0")
    while words and words[-1] == "":
        words.pop()
    return tuple(words)


def parse_environ(raw: bytes) -> dict[str, str]:
    env: dict[str, str] = {}
    for item in raw.decode("utf-8", "replace").split("\0"):
        key, sep, value = item.partition("=")
        if sep and key:
            env[key] = value
    return env


def parse_cgroup(text: str) -> tuple[str | None, bool, str | None]:
    """(innermost service, whether a user's manager runs it, container scope) of a cgroup."""
    unit: str | None = None
    user = False
    container: str | None = None
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3 or not parts[2].strip("/"):
            continue
        components = parts[2].strip("/").split("/")
        for component in components:
            if component.startswith("user@") and component.endswith(".service"):
                user = True
            elif component.endswith(".service"):
                unit = component
            if (
                component.endswith(".scope")
                and component.startswith(("docker-", "libpod-", "cri-containerd-", "crio-"))
            ) or (component.startswith("kubepods") and container is None):
                container = component
        if components[0] in ("docker", "kubepods", "lxc", "machine.slice") and container is None:
            container = "/".join(components[:2])
        if unit is not None or container is not None:
            break
    if container is not None:
        # A service inside a container's cgroup is the container's, not the host's.
        unit = None
    return unit, user and unit is not None, container


def _uid(base: Path) -> int | None:
    """The real UID on /proc/PID/status's `Uid:` line."""
    for line in (_read(base / "status") or b"").decode("utf-8", "replace").splitlines():
        if line.startswith("Uid:"):
            fields = line.split()
            return int(fields[1]) if len(fields) > 1 and fields[1].isdigit() else None
    return None


def read_process(proc_root: Path, pid: int, own: OwnNamespaces | None = None) -> Process | None:
    """Process `pid` from `proc_root`, or None when it has gone; its namespaces compared
    with `own` (default: this process's)."""
    own = own or OwnNamespaces.read()
    base = proc_root / str(pid)
    stat = _read(base / "stat")
    if stat is None:
        return None
    text = stat.decode("utf-8", "replace")
    fields = text[text.rfind(")") + 1 :].split()
    ppid = int(fields[1]) if len(fields) > 1 and fields[1].lstrip("-").isdigit() else None
    comm = (_read(base / "comm") or b"").decode("utf-8", "replace").rstrip("\n")
    argv = split_cmdline(_read(base / "cmdline") or b"")
    environ = _read(base / "environ")
    env = parse_environ(environ) if environ is not None else None
    cwd: Path | None = None
    with contextlib.suppress(OSError):
        # Followed to its end: a proc root may link to /proc's own magic links.
        cwd = Path(os.path.realpath(base / "cwd", strict=True))
    unit, user_unit, container = parse_cgroup(
        (_read(base / "cgroup") or b"").decode("utf-8", "replace")
    )
    sockets: set[str] = set()
    fds_readable = True
    try:
        names = os.listdir(base / "fd")
    except OSError:
        names, fds_readable = [], False
    for name in names:
        with contextlib.suppress(OSError):
            target = os.readlink(base / "fd" / name)
            if target.startswith("socket:["):
                sockets.add(target[len("socket:[") : -1])
    return Process(
        pid=pid,
        ppid=ppid,
        comm=comm,
        argv=argv,
        env=env,
        cwd=cwd,
        unit=unit,
        user_unit=user_unit,
        container=container,
        sockets=frozenset(sockets),
        fds_readable=fds_readable,
        namespaces=own.of(base),
        uid=_uid(base),
    )


def read_processes(proc_root: Path, own: OwnNamespaces | None = None) -> dict[int, Process]:
    """Every process under `proc_root`, by PID."""
    own = own or OwnNamespaces.read()
    try:
        pids = sorted(int(p.name) for p in proc_root.iterdir() if p.name.isdigit())
    except OSError:
        return {}
    found = {}
    for pid in pids:
        process = read_process(proc_root, pid, own)
        if process is not None:
            found[pid] = process
    return found


def _ipv4(hex_address: str) -> str:
    return str(ipaddress.IPv4Address(bytes.fromhex(hex_address)[::-1]))


def _ipv6(hex_address: str) -> str:
    raw = bytes.fromhex(hex_address)
    # Four 32-bit words, each in the host's (little-endian) byte order.
    ordered = b"".join(raw[i : i + 4][::-1] for i in range(0, 16, 4))
    address = ipaddress.IPv6Address(ordered)
    mapped = address.ipv4_mapped
    return str(mapped) if mapped is not None else str(address)


def read_listeners(proc_root: Path) -> tuple[Listener, ...]:
    """The listening TCP sockets of /proc/net/tcp and tcp6."""
    found: list[Listener] = []
    for table, parse in (("tcp", _ipv4), ("tcp6", _ipv6)):
        raw = _read(proc_root / "net" / table)
        if raw is None:
            continue
        for line in raw.decode("ascii", "replace").splitlines()[1:]:
            fields = line.split()
            if len(fields) < 10 or fields[3] != LISTEN_STATE:
                continue
            hex_address, _, hex_port = fields[1].rpartition(":")
            with contextlib.suppress(ValueError):
                found.append(Listener(parse(hex_address), int(hex_port, 16), fields[9]))
    return tuple(sorted(set(found), key=lambda li: (li.port, li.host, li.inode)))


# -- NVML ------------------------------------------------------------------------------


def read_nvml(
    library: Path | None,
) -> tuple[str, tuple[Device, ...], tuple[GpuProcess, ...], str]:
    """(driver version, devices, GPU processes, error) from one NVML sample."""
    from gpugate.gpu.nvml import NvmlError, NvmlReader, library_from

    try:
        with NvmlReader(library_from(library)) as reader:
            sample = reader.read()
    except NvmlError as exc:
        return "", (), (), str(exc)
    devices = tuple(
        Device(d.index, d.name, d.uuid, d.total, d.reserved, d.used) for d in sample.devices
    )
    processes = tuple(
        GpuProcess(p.pid, d.index, p.used) for d in sample.devices for p in d.processes
    )
    faults = [
        f"GPU {d.index}: {d.process_fault.message}" for d in sample.devices if d.process_fault
    ]
    return sample.driver_version, devices, processes, "; ".join(faults)


# -- systemd ---------------------------------------------------------------------------


def parse_show(text: str, name: str) -> UnitInfo:
    """`systemctl show --property=...` output (`Key=Value` lines) as a UnitInfo."""
    from gpugate.runtimes.process import exec_start_argv

    values: dict[str, list[str]] = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep:
            values.setdefault(key, []).append(value)

    def one(key: str) -> str:
        return values.get(key, [""])[0]

    environment: dict[str, str] = {}
    for value in values.get("Environment", []):
        try:
            words = shlex.split(value)
        except ValueError:
            words = value.split()
        for word in words:
            key, sep, val = word.partition("=")
            if sep:
                environment[key] = val
    files = tuple(
        value.rsplit(" (ignore_errors=", 1)[0].strip()
        for value in values.get("EnvironmentFiles", [])
        if value.strip()
    )
    exec_start = exec_start_argv(one("ExecStart")) if one("ExecStart") else None
    return UnitInfo(
        name=one("Id") or name,
        load_state=one("LoadState"),
        active_state=one("ActiveState"),
        fragment_path=one("FragmentPath"),
        drop_in_paths=tuple(one("DropInPaths").split()),
        exec_start=tuple(exec_start) if exec_start else None,
        environment=environment,
        environment_files=files,
        user=one("User"),
    )


def read_unit(name: str, systemctl: str = "systemctl") -> UnitInfo:
    """`systemctl show` of one system unit; a UnitInfo with `error` when it cannot be read."""
    argv = [systemctl, "show", "--property=" + ",".join(UNIT_PROPERTIES), name]
    try:
        done = subprocess.run(
            argv,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=SYSTEMCTL_TIMEOUT,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return UnitInfo(name, error=f"cannot run {systemctl} show: {exc}")
    if done.returncode != 0:
        reason = done.stderr.strip().splitlines()[-1] if done.stderr.strip() else ""
        return UnitInfo(name, error=f"systemctl show exited {done.returncode} {reason}".strip())
    return parse_show(done.stdout, name)


def read_units(names: Iterable[str], systemctl: str = "systemctl") -> dict[str, UnitInfo]:
    """`systemctl show` of each unit, once each."""
    return {name: read_unit(name, systemctl) for name in dict.fromkeys(names)}


# -- the whole host --------------------------------------------------------------------


def scan_host(
    proc_root: Path = Path("/proc"), nvml_library: Path | None = None, hostname: str = ""
) -> HostScan:
    """One reading of the host: NVML first (its PIDs), then /proc."""
    driver, devices, gpu_processes, error = read_nvml(nvml_library)
    own = OwnNamespaces.read()
    return HostScan(
        hostname=hostname or os.uname().nodename,
        proc_root=proc_root,
        driver_version=driver,
        devices=devices,
        gpu_processes=gpu_processes,
        nvml_error=error,
        processes=read_processes(proc_root, own),
        listeners=read_listeners(proc_root),
        own=own.shown,
    )


# -- what a runtime itself says ----------------------------------------------------------


@attrs.frozen
class LoadedModel:
    """A model a runtime holds now, as it reports it."""

    name: str
    vram: int


def ask_ollama_ps(host: str, port: int, timeout: float = 2.0) -> tuple[list[LoadedModel], str]:
    """Ollama's `GET /api/ps`: the models it holds and their VRAM; ([], why) when it does
    not answer. An address bound to every interface is asked on loopback."""
    import json
    import urllib.error
    import urllib.request

    if host in ("0.0.0.0", "::", ""):
        host = "127.0.0.1"
    shown = f"[{host}]" if ":" in host else host
    url = f"http://{shown}:{port}/api/ps"
    try:
        with urllib.request.urlopen(url, timeout=timeout) as answer:
            body = json.loads(answer.read(1 << 20))
    except (OSError, ValueError, urllib.error.URLError) as exc:
        return [], f"GET {url}: {exc}"
    models = []
    entries = body.get("models") if isinstance(body, dict) else None
    for entry in entries if isinstance(entries, list) else []:
        if not isinstance(entry, dict):
            continue
        name = entry.get("name") or entry.get("model")
        vram = entry.get("size_vram")
        if isinstance(name, str) and isinstance(vram, int) and vram > 0:
            models.append(LoadedModel(name, vram))
    return models, ""


COMFYUI_FOLDERS = (
    "checkpoints",
    "diffusion_models",
    "unet",
    "text_encoders",
    "clip",
    "vae",
    "loras",
    "controlnet",
    "upscale_models",
    "clip_vision",
    "style_models",
    "gligen",
    "hypernetworks",
    "photomaker",
)
"""ComfyUI's model folders whose files a prompt loads onto the card."""
COMFYUI_EXTENSIONS = (".safetensors", ".sft", ".ckpt", ".pt", ".pt2", ".pth", ".bin", ".gguf")
COMFYUI_MAX_FILES = 400


def comfyui_model_files(models_dir: Path) -> list[tuple[str, int]]:
    """(FOLDER/NAME, bytes on disk) of each model file under ComfyUI's models folder."""
    found: list[tuple[str, int]] = []
    for folder in COMFYUI_FOLDERS:
        top = models_dir / folder
        if not top.is_dir():
            continue
        for dirpath, _dirs, files in os.walk(top, followlinks=True):
            for name in sorted(files):
                if not name.lower().endswith(COMFYUI_EXTENSIONS):
                    continue
                path = Path(dirpath) / name
                try:
                    size = path.stat().st_size
                except OSError:
                    continue
                found.append((f"{folder}/{path.relative_to(top).as_posix()}", size))
                if len(found) >= COMFYUI_MAX_FILES:
                    return sorted(found)
    return sorted(found)
