"""Which service owns a GPU process: PID → `Owner`, read from a proc tree.

NVML lists host PIDs and nothing else. The owner is found from what `/proc/<pid>` tells:
the systemd units and scopes in its cgroup (the most robust key, since children inherit
it), its command line, and its name (`comm`). A process that matches no rule belongs to
the first ancestor that does, because runtimes hold VRAM in child processes (Ollama's
runners are children of `ollama serve`). Rules of consumers are tried before rules of
external services; a process nothing claims is external `other`.

Reads are cached per (pid, start time): a PID the kernel reuses for a new process has a
new start time and is attributed afresh, and a steady sample costs one `stat` read per
process. A process keeps its first attribution for its lifetime; NVML only lists a
process once it has created a GPU context, which is after any exec that could change
its command line.
"""

from __future__ import annotations

import enum
import threading
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

import attrs

from gpugate.config.model import Config, Consumer, ExternalService, ProcessMatch
from gpugate.core.observation import OTHER, Owner, OwnerKind

COMM_LENGTH = 15
"""The kernel keeps this many characters of a process name (TASK_COMM_LEN − 1)."""
MAX_ANCESTRY = 16
"""How many parents are walked before giving up; also ends cycles in a corrupt tree."""

_UNIT_SUFFIXES = (".service", ".scope")
_STAT_PPID = 1
_STAT_START_TIME = 19
"""Indexes into the fields after `(comm)` in /proc/<pid>/stat (fields 4 and 22 of proc(5))."""


class MatchKind(enum.Enum):
    """Why a process got its owner."""

    UNIT = "unit"
    """A systemd unit or scope in its cgroup is listed in `units`."""
    COMMAND = "command"
    """An entry of `commands` occurs in its command line."""
    NAME = "name"
    """Its comm equals an entry of `names` (cut to 15 characters)."""
    NONE = "none"
    """Neither it nor any ancestor matched: external `other`."""
    VANISHED = "vanished"
    """It no longer exists in the proc tree: external `other`."""


@attrs.frozen
class ProcessInfo:
    """What the proc tree says about one process; empty fields were unreadable."""

    pid: int
    start_time: int | None
    """Clock ticks after boot (stat field 22); None when stat could not be read."""
    ppid: int | None
    comm: str = ""
    cmdline: str = ""
    """Arguments joined with single spaces."""
    units: tuple[str, ...] = ()
    """Every `*.service` and `*.scope` component of its cgroup paths, outermost first."""
    nspid: tuple[int, ...] = ()
    """Its PID in each nested PID namespace, host first (a container's own PID last)."""


@attrs.frozen
class Attribution:
    """The owner of one PID, with the evidence."""

    pid: int
    owner: Owner
    match: MatchKind
    matched: str = ""
    """The unit, command or name that matched."""
    via: int | None = None
    """The PID whose properties matched: the process itself or an ancestor."""
    name: str = ""
    """The process's own comm ("" when unknown)."""


@attrs.frozen
class _Rule:
    owner: Owner
    units: frozenset[str]
    commands: tuple[str, ...]
    names: frozenset[str]

    @classmethod
    def of(cls, owner: Owner, match: ProcessMatch) -> _Rule:
        return cls(
            owner,
            frozenset(u for u in match.units if u),
            # An empty command would be a substring of every command line.
            tuple(c for c in match.commands if c),
            frozenset(n[:COMM_LENGTH] for n in match.names if n),
        )

    def match(self, info: ProcessInfo) -> tuple[MatchKind, str] | None:
        for unit in info.units:
            if unit in self.units:
                return MatchKind.UNIT, unit
        for command in self.commands:
            if command in info.cmdline:
                return MatchKind.COMMAND, command
        if info.comm and info.comm in self.names:
            return MatchKind.NAME, info.comm
        return None


class ProcessAttributor:
    """Attributes PIDs to consumers and external services; safe to call from any thread."""

    def __init__(
        self,
        consumers: Sequence[Consumer] = (),
        external: Sequence[ExternalService] = (),
        *,
        proc_root: Path = Path("/proc"),
        max_ancestry: int = MAX_ANCESTRY,
    ) -> None:
        self.proc_root = Path(proc_root)
        self.max_ancestry = max_ancestry
        self._rules = tuple(
            [_Rule.of(Owner(OwnerKind.CONSUMER, c.name), c.processes) for c in consumers]
            + [_Rule.of(Owner(OwnerKind.EXTERNAL, e.name), e.processes) for e in external]
        )
        self._lock = threading.Lock()
        self._owners: dict[tuple[int, int], Attribution] = {}
        self._infos: dict[tuple[int, int], ProcessInfo] = {}
        self._previous: dict[int, Attribution] = {}
        """Last sample's owners by PID, for processes NVML still lists after /proc lost them."""
        self.reads = 0
        """Files read so far (a measure of what the cache saves)."""

    @classmethod
    def from_config(cls, config: Config) -> ProcessAttributor:
        """An attributor for the consumers and external services of a configuration."""
        return cls(config.consumers, config.external, proc_root=config.gate.proc_root)

    def attribute(self, pids: Iterable[int]) -> dict[int, Attribution]:
        """Attribute every PID of one sample; forgets cached processes not seen in it."""
        with self._lock:
            touched: set[tuple[int, int]] = set()
            result = {pid: self._attribute(pid, touched) for pid in pids}
            for pid, attribution in result.items():
                # An exiting process can leave /proc before NVML stops listing it (its
                # memory is not back yet): it is still whoever it was a sample ago.
                if attribution.match is MatchKind.VANISHED and pid in self._previous:
                    result[pid] = self._previous[pid]
            self._owners = {k: v for k, v in self._owners.items() if k in touched}
            self._infos = {k: v for k, v in self._infos.items() if k in touched}
            self._previous = result
            return result

    def explain(self, pid: int) -> Attribution:
        """The owner of one PID and why (keeps the cache as it is)."""
        with self._lock:
            return self._attribute(pid, set())

    def owner(self, pid: int) -> Owner:
        """The owner of one PID."""
        return self.explain(pid).owner

    # -- internals ---------------------------------------------------------------------

    def _attribute(self, pid: int, touched: set[tuple[int, int]]) -> Attribution:
        stat = self._stat(pid)
        if stat is not None:
            key = (pid, stat[1])
            cached = self._owners.get(key)
            if cached is not None:
                touched.add(key)
                return cached
        info = self._info(pid, stat, touched)
        if info is None:
            return Attribution(pid, Owner(OwnerKind.EXTERNAL, OTHER), MatchKind.VANISHED)
        attribution = self._resolve(info, touched)
        if info.start_time is not None:
            key = (pid, info.start_time)
            self._owners[key] = attribution
            touched.add(key)
        return attribution

    def _resolve(self, info: ProcessInfo, touched: set[tuple[int, int]]) -> Attribution:
        current = info
        seen = {info.pid}
        for _ in range(self.max_ancestry + 1):
            for rule in self._rules:
                found = rule.match(current)
                if found is not None:
                    kind, matched = found
                    return Attribution(info.pid, rule.owner, kind, matched, current.pid, info.comm)
            parent = current.ppid
            # PID 1 (init, or a container's init seen from the host) owns everything;
            # matching it would attribute every orphan to whatever rule names it.
            if parent is None or parent <= 1 or parent in seen:
                break
            seen.add(parent)
            ancestor = self._info(parent, self._stat(parent), touched)
            if ancestor is None:
                break
            current = ancestor
        return Attribution(
            info.pid, Owner(OwnerKind.EXTERNAL, OTHER), MatchKind.NONE, name=info.comm
        )

    def _info(
        self, pid: int, stat: tuple[int | None, int] | None, touched: set[tuple[int, int]]
    ) -> ProcessInfo | None:
        """Everything readable about `pid`, or None when it has gone."""
        if stat is not None:
            key = (pid, stat[1])
            cached = self._infos.get(key)
            if cached is not None:
                touched.add(key)
                return cached
        elif not (self.proc_root / str(pid)).is_dir():
            return None
        status = _status_fields(self._read(pid, "status"))
        ppid = stat[0] if stat is not None else _int_or_none(status.get("PPid", ""))
        nspid = tuple(int(n) for n in status.get("NSpid", "").split() if n.isdigit())
        comm = self._read(pid, "comm").rstrip("\n")
        cmdline = " ".join(a for a in self._read(pid, "cmdline").split("\0") if a)
        units = _units(self._read(pid, "cgroup"))
        info = ProcessInfo(pid, stat[1] if stat else None, ppid, comm, cmdline, units, nspid)
        # An exiting process (or one between fork and exec) reads back an empty or
        # borrowed command line: do not pin what it shows now for its whole life.
        if stat is not None and cmdline:
            self._infos[(pid, stat[1])] = info
            touched.add((pid, stat[1]))
        return info

    def _stat(self, pid: int) -> tuple[int | None, int] | None:
        """(ppid, start time) from stat, or None when stat is gone or unreadable."""
        text = self._read(pid, "stat")
        # comm may hold spaces and parentheses: the fields start after the last ")".
        fields = text[text.rfind(")") + 1 :].split()
        if len(fields) <= _STAT_START_TIME:
            return None
        start = _int_or_none(fields[_STAT_START_TIME])
        if start is None:
            return None
        return _int_or_none(fields[_STAT_PPID]), start

    def _read(self, pid: int, name: str) -> str:
        """A proc file's text, or "" when it is gone or unreadable (hidepid, permissions)."""
        self.reads += 1
        try:
            with open(self.proc_root / str(pid) / name, "rb") as fh:
                data = fh.read()
        except OSError:
            return ""
        return data.decode("utf-8", "replace")


def _units(cgroup: str) -> tuple[str, ...]:
    """Every unit and scope named by the paths of a cgroup file (v1 and v2 lines alike)."""
    units: list[str] = []
    for line in cgroup.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        for component in parts[2].split("/"):
            if component.endswith(_UNIT_SUFFIXES) and component not in units:
                units.append(component)
    return tuple(units)


def _status_fields(text: str) -> Mapping[str, str]:
    fields: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep:
            fields[key] = value.strip()
    return fields


def _int_or_none(text: str) -> int | None:
    try:
        return int(text)
    except ValueError:
        return None
