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

import os
from collections.abc import Mapping
from pathlib import Path

from gpugate.init.addresses import Ports
from gpugate.init.cmdline import program_of
from gpugate.init.fronts import front_for
from gpugate.init.plan import (
    ADMIT_TOKEN,
    CONFIG_PATH,
    CONTROL_TOKEN,
    DEFAULT_CONTROL_PORT,
    GATE_UNIT_PATH,
    Front,
    Options,
    Plan,
    Service,
)
from gpugate.init.recognise import Address, Found, Recognised
from gpugate.init.scan import HostScan, LoadedModel
from gpugate.init.systemd import UnitInfo


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
    ports = Ports(in_use, listen_ports | {control_port})
    kinds = [found.kind for found, _ in fronted]
    default_gpu = scan.devices[0].index if scan.devices else 0
    fronts: list[Front] = []
    for found, address in fronted:
        name = found.kind if kinds.count(found.kind) == 1 else f"{found.kind}-{address.port}"
        front = front_for(name, found, address, scan, units, ports, default_gpu, loaded, options)
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
