"""What `systemctl show` says of the units the recognised runtimes run in."""

from __future__ import annotations

import shlex
import subprocess
from collections.abc import Iterable, Mapping

import attrs

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


# -- systemd ---------------------------------------------------------------------------


def parse_show(text: str, name: str) -> UnitInfo:
    """`systemctl show --property=...` output (`Key=Value` lines) as a UnitInfo."""
    from gpugate.runtimes.process_systemd import exec_start_argv

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
