"""Which service owns a GPU process: PID → `Owner`, read from a proc tree.

NVML lists host PIDs and nothing else. The owner is found from what `/proc/<pid>` tells:
the systemd units and scopes in its cgroup (the most robust key, since children inherit
it), its command line, and its name (`comm`). A process that matches no rule belongs to
the first ancestor that does, because runtimes hold VRAM in child processes (Ollama's
runners are children of `ollama serve`). Rules of consumers are tried before rules of
external services; a process nothing claims is external `other`.

Reads are cached per (pid, start time): a PID the kernel reuses for a new process has a
new start time and is attributed afresh. A process keeps its first attribution for its
lifetime; NVML only lists a process once it has created a GPU context, which is after
any exec that could change its command line.

What tells that a PID is still the process it was: over this namespace's /proc, a pidfd
opened before the PID's entry was read (`exits.py`). While it has not fired, the cached
attribution holds, and a steady sample reads nothing from /proc: one epoll wait over
every pidfd says which processes exited, and only those and new PIDs are read again.
Where pidfds cannot be had (another PID namespace's /proc, an old kernel, the bound on
descriptors) a PID costs one `stat` read per sample, for its start time.
"""

from __future__ import annotations

import enum
import os
import threading
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

import attrs

from gpugate.config.model import Config, Consumer, ExternalService, ProcessMatch
from gpugate.core.observation import OTHER, Owner, OwnerKind
from gpugate.gpu.exits import ExitWatch, pidfds_available, same_pid_namespace

COMM_LENGTH = 15
"""The kernel keeps this many characters of a process name (TASK_COMM_LEN − 1)."""
MAX_ANCESTRY = 16
"""How many parents are walked before giving up; also ends cycles in a corrupt tree."""

_UNIT_SUFFIXES = (".service", ".scope")
_STAT_PPID = 1
_STAT_START_TIME = 19
"""Indexes into the fields after `(comm)` in /proc/<pid>/stat (fields 4 and 22 of proc(5))."""
_READ_SIZE = 4096
_Key = tuple[int, int]
"""(pid, start time): one process, whatever reuses its PID later."""


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
        watch_exits: bool | None = None,
        exits: ExitWatch | None = None,
    ) -> None:
        """`watch_exits`: hold pidfds to know which processes are still the ones read
        (None: where `proc_root` is this PID namespace's /proc and Python has pidfds);
        `exits`: the watch to hold them in (a new one by default)."""
        self.proc_root = Path(proc_root)
        self._proc = str(self.proc_root)
        self.max_ancestry = max_ancestry
        if watch_exits is None:
            watch_exits = pidfds_available() and same_pid_namespace(self._proc)
        self._watch: ExitWatch | None = None
        if watch_exits:
            try:
                self._watch = exits if exits is not None else ExitWatch()
            except OSError:  # not a descriptor to spare for the epoll set: read /proc
                self._watch = None
        self._trusted: dict[int, _Key] = {}
        """PID → the process its live pidfd was opened for, whose attribution is cached."""
        self._settled = False
        """The caches hold the last sample's PIDs alone, every one of them trusted."""
        self._rules = tuple(
            [_Rule.of(Owner(OwnerKind.CONSUMER, c.name), c.processes) for c in consumers]
            + [_Rule.of(Owner(OwnerKind.EXTERNAL, e.name), e.processes) for e in external]
        )
        self._lock = threading.Lock()
        self._owners: dict[_Key, Attribution] = {}
        self._infos: dict[_Key, ProcessInfo] = {}
        self._previous: dict[int, Attribution] = {}
        """Last sample's owners by PID, for processes NVML still lists after /proc lost them."""
        self.reads = 0
        """Files read so far (a measure of what the cache saves)."""

    @classmethod
    def from_config(cls, config: Config) -> ProcessAttributor:
        """An attributor for the consumers and external services of a configuration."""
        return cls(config.consumers, config.external, proc_root=config.gate.proc_root)

    @property
    def watched(self) -> int:
        """How many processes are watched through a pidfd (0 where there are none)."""
        return 0 if self._watch is None else len(self._watch)

    def close(self) -> None:
        """Let go of every pidfd; the attributor goes on, reading /proc, if used again."""
        with self._lock:
            if self._watch is not None:
                self._watch.close()
            self._trusted.clear()
            self._settled = False

    def attribute(self, pids: Iterable[int]) -> dict[int, Attribution]:
        """Attribute every PID of one sample; forgets cached processes not seen in it."""
        with self._lock:
            if self._watch is not None:
                return self._attribute_watched_all(self._watch, pids)
            touched: set[_Key] = set()
            result = {pid: self._attribute(pid, touched)[0] for pid in pids}
            self._settle(result, result, touched)
            return result

    def explain(self, pid: int) -> Attribution:
        """The owner of one PID and why (keeps the cache as it is)."""
        with self._lock:
            # What it caches is no PID's of the last sample: the next one sorts it out.
            self._settled = False
            return self._attribute(pid, set())[0]

    def owner(self, pid: int) -> Owner:
        """The owner of one PID."""
        return self.explain(pid).owner

    # -- internals ---------------------------------------------------------------------

    def _attribute_watched_all(
        self, watch: ExitWatch, pids: Iterable[int]
    ) -> dict[int, Attribution]:
        trusted, owners = self._trusted, self._owners
        exited = watch.exited()
        for pid in exited:
            trusted.pop(pid, None)
        if self._settled and not exited and self._previous.keys() == pids:
            # The same PIDs as the last sample, each still behind its live pidfd, and
            # nothing else cached: the last answer stands.
            return dict(self._previous)
        touched: set[_Key] = set()
        result: dict[int, Attribution] = {}
        read: list[int] = []
        for pid in pids:
            key = trusted.get(pid)
            cached = None if key is None else owners.get(key)
            if cached is None:
                cached = self._attribute_watched(watch, pid, touched)
                read.append(pid)
            result[pid] = cached
        # PIDs NVML no longer lists: their pidfds would only use up descriptors.
        watch.keep_only(result)
        self._trusted = {p: k for p, k in trusted.items() if p in result}
        touched.update(self._trusted.values())
        self._settle(result, read, touched)
        self._settled = not read and len(self._trusted) == len(result)
        return result

    def _settle(
        self, result: dict[int, Attribution], read: Iterable[int], touched: set[_Key]
    ) -> None:
        """Finish a sample: what left /proc keeps its last owner, and the caches forget
        every process the sample did not touch."""
        for pid in read:
            # An exiting process can leave /proc before NVML stops listing it (its
            # memory is not back yet): it is still whoever it was a sample ago.
            if result[pid].match is MatchKind.VANISHED and pid in self._previous:
                result[pid] = self._previous[pid]
        self._owners = {k: v for k, v in self._owners.items() if k in touched}
        self._infos = {k: v for k, v in self._infos.items() if k in touched}
        self._previous = result

    def _attribute_watched(self, watch: ExitWatch, pid: int, touched: set[_Key]) -> Attribution:
        key = self._trusted.get(pid)
        if key is not None:
            cached = self._owners.get(key)
            if cached is not None:
                touched.add(key)
                return cached
        # Opened before /proc is read: should the process exit and its PID go to another
        # between the two, the pidfd fires at the next sample and the PID is read again.
        watched = watch.watch(pid)
        attribution, key = self._attribute(pid, touched)
        if watched and key is not None:
            self._trusted[pid] = key
        else:
            self._trusted.pop(pid, None)
            watch.forget(pid)
        return attribution

    def _attribute(self, pid: int, touched: set[_Key]) -> tuple[Attribution, _Key | None]:
        """The attribution from /proc, and the key it is cached under (None: not cached)."""
        stat = self._stat(pid)
        if stat is not None:
            key = (pid, stat[1])
            cached = self._owners.get(key)
            if cached is not None:
                touched.add(key)
                return cached, key
        info = self._info(pid, stat, touched)
        if info is None:
            return Attribution(pid, Owner(OwnerKind.EXTERNAL, OTHER), MatchKind.VANISHED), None
        attribution = self._resolve(info, touched)
        if info.start_time is None:
            return attribution, None
        key = (pid, info.start_time)
        self._owners[key] = attribution
        touched.add(key)
        return attribution, key

    def _resolve(self, info: ProcessInfo, touched: set[_Key]) -> Attribution:
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
        self, pid: int, stat: tuple[int | None, int] | None, touched: set[_Key]
    ) -> ProcessInfo | None:
        """Everything readable about `pid`, or None when it has gone."""
        if stat is not None:
            key = (pid, stat[1])
            cached = self._infos.get(key)
            if cached is not None:
                touched.add(key)
                return cached
        elif not os.path.isdir(f"{self._proc}/{pid}"):
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
        # os.open/os.read on a formatted path: a pathlib path and a buffered file cost
        # twice as much, once per PID per sample where pidfds are not available.
        try:
            fd = os.open(f"{self._proc}/{pid}/{name}", os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            return ""
        try:
            chunks = []
            while chunk := os.read(fd, _READ_SIZE):
                chunks.append(chunk)
        except OSError:  # EISDIR, ESRCH once the process is gone, EACCES on some fields
            return ""
        finally:
            os.close(fd)
        return b"".join(chunks).decode("utf-8", "replace")


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
