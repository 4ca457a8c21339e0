"""Processes and listening sockets as /proc shows them, secrets in command lines hidden."""

from __future__ import annotations

import contextlib
import ipaddress
import os
import re
import shlex
from collections.abc import Iterable, Mapping
from pathlib import Path

import attrs

from gpugate.init.namespaces import HERE, Namespaces, OwnNamespaces

LISTEN_STATE = "0A"
"""The state column of a listening socket in /proc/net/tcp{,6}."""


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
