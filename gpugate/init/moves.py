"""moves.txt: what init found, and the moves that put the gate in front, in order.

Init runs none of them. Each move is printed with its undo, one command that puts back
what the move changed, so that the host can be taken back a move at a time (the undo lines
from the last move up): a move never replaces a file that is there (`Plan.present`: the
move says so and leaves it to be merged by hand), the tokens are made only where none is
(and with the shell's noclobber), and an undo that needs an earlier move undone first (a
restart without its drop-in) does that itself, so that running an undo twice does no harm.
"""

from __future__ import annotations

import shlex

import attrs

from gpugate.init.plan import (
    ADMIT_TOKEN,
    CONFIG_FILE,
    CONFIG_PATH,
    CONTROL_TOKEN,
    GATE_UNIT_FILE,
    GATE_UNIT_PATH,
    Front,
    Plan,
    gib,
    mib,
)
from gpugate.init.proc import HIDDEN, redact

TOKEN_DIRECTORY = "/etc/gpugate"


@attrs.frozen
class Move:
    """One step of the moves: what it does, its commands, and the command that undoes it."""

    title: str
    commands: tuple[str, ...] = ()
    undo: str = ""
    """One command that puts back what the move changed ("" when it changes nothing)."""


def moves_text(plan: Plan) -> str:
    """What was found, and the commands that put the gate in front, in order (none run)."""
    scan, options = plan.scan, plan.options
    out = options.out
    lines: list[str] = [f"gpugate init on {scan.hostname}: what it found, and the moves."]
    lines.append("")
    lines.append("Found:")
    if scan.devices:
        for device in scan.devices:
            lines.append(
                f"  GPU {device.index}  {device.name}  {gib(device.total)}, "
                f"{gib(device.used)} used (driver {scan.driver_version or '?'})"
            )
    else:
        lines.append("  no GPU (NVML: " + (scan.nvml_error or "no device") + ")")
    for front in plan.fronts:
        found = front.found
        assert found.address is not None
        held = f", {mib(found.bytes_now)} MiB on GPU {front.gpu}" if found.bytes_now else ""
        unit = f", unit {front.unit}" if front.unit else ", no unit"
        lines.append(
            f"  {front.name:<10} pid {found.process.pid:<7} {front.was} "
            f"({found.address.source}){unit}{held}"
        )
    for service in plan.services:
        found = service.found
        held = f", {mib(found.bytes_now)} MiB" if found.bytes_now else ""
        unit = f", unit {service.unit}" if service.unit else ""
        lines.append(f"  {service.name:<10} pid {found.process.pid:<7} external{unit}{held}")
    for found, why in plan.left_out:
        lines += wrap(f"  {found.kind:<10} pid {found.process.pid:<7} not fronted: {why}", "   ")
    for unknown in plan.recognised.unknown:
        used = f"{mib(unknown.used)} MiB" if unknown.used is not None else "? MiB"
        lines.append(
            f"  unknown: pid {unknown.pid}, {unknown.command}, {used} on GPU {unknown.gpu}"
        )
    if plan.recognised.unknown:
        lines += wrap(
            "  (left out of consumers.yaml: its memory counts as external 'other'; give it a "
            "consumer or an external entry by hand)",
            "   ",
        )
    lines.append("")
    lines += wrap(
        f"Moves, in order. gpugate init ran none of them; the files they install are those "
        f"it writes into {out}/ (without --dry-run). Each is followed by its undo, one command "
        "that puts back what it changed: to go back, run the undo lines from the last move up.",
        "",
    )
    for number, move in enumerate(moves(plan), 1):
        lines.append("")
        lines += wrap(f"{number}. {move.title}", "   ")
        lines += [f"     {command}" for command in move.commands]
        if move.undo:
            lines.append(f"   undo: {move.undo}")
    notes = list(plan.notes)
    for front in plan.fronts:
        notes += [f"{front.name}: {note}" for note in front.notes]
    if notes:
        lines.append("")
        lines.append("Notes:")
        for note in notes:
            lines += wrap(f"* {note}", "  ")
    return "\n".join(lines) + "\n"


def wrap(text: str, indent: str, width: int = 92) -> list[str]:
    """`text` in lines of about `width`, its own leading space kept, the rest `indent`ed."""
    lines: list[str] = []
    lead = text[: len(text) - len(text.lstrip())]
    current = ""
    for word in text.split():
        if current and len(current) + 1 + len(word) > width:
            lines.append(current)
            current = indent + word
        else:
            current = f"{current} {word}" if current else lead + word
    if current:
        lines.append(current)
    return lines


def _and(*commands: str) -> str:
    return " && ".join(command for command in commands if command)


def _remove(paths: list[str]) -> str:
    return f"sudo rm -f {' '.join(map(shlex.quote, paths))}" if paths else ""


def moves(plan: Plan) -> list[Move]:
    """Every move, in the order it must run."""
    options = plan.options
    out = str(options.out)
    steps: list[Move] = []
    config = f"{out}/{CONFIG_FILE}"
    check = f"{options.gpugate} check {CONFIG_PATH}"
    if CONFIG_PATH in plan.present:
        steps.append(
            Move(
                f"A configuration is installed at {CONFIG_PATH} already, and init does not "
                f"replace it: compare it with {config}, merge what you want by hand, and "
                "check it:",
                (check,),
            )
        )
    else:
        steps.append(
            Move(
                "Review the files, then install the configuration and check it:",
                (f"sudo install -D -m 0644 {shlex.quote(config)} {CONFIG_PATH}", check),
                f"sudo rm -f {CONFIG_PATH}",
            )
        )
    steps += _tokens(plan)
    drop_ins = [front for front in plan.fronts if front.drop_in is not None]
    installed = {
        front.name: front.drop_in.install_path
        for front in drop_ins
        if front.drop_in is not None and front.drop_in.install_path not in plan.present
    }
    if drop_ins:
        commands = [
            f"sudo install -D -m 0644 {shlex.quote(out + '/' + front.drop_in.path)} "
            f"{front.drop_in.install_path}"
            for front in drop_ins
            if front.drop_in is not None and front.name in installed
        ]
        kept = [
            front.drop_in.install_path
            for front in drop_ins
            if front.drop_in is not None and front.name not in installed
        ]
        title = "Install the drop-ins:"
        if kept:
            title = (
                f"Install the drop-ins ({', '.join(kept)} is there already, and init does not "
                "replace it: merge the one it wrote by hand):"
            )
        steps.append(
            Move(
                title,
                (*commands, "sudo systemctl daemon-reload"),
                _and(_remove(list(installed.values())), "sudo systemctl daemon-reload"),
            )
        )

    def without_drop_ins(fronts: list[Front], then: str) -> str:
        """Remove these fronts' drop-ins, reload, then `then` their units."""
        paths = [installed[front.name] for front in fronts if front.name in installed]
        units = " ".join(str(front.unit) for front in fronts)
        return _and(
            _remove(paths), "sudo systemctl daemon-reload", f"sudo systemctl {then} {units}"
        )

    moving = [front for front in drop_ins if not front.admitted]
    if moving:
        steps.append(
            Move(
                "Move each runtime to its loopback port (its clients get no answer until the "
                "gate is up):",
                tuple(
                    f"sudo systemctl restart {front.unit}    "
                    f"# {front.was} -> 127.0.0.1:{front.upstream_port}"
                    for front in moving
                ),
                without_drop_ins(moving, "restart"),
            )
        )
    admitted = [front for front in plan.fronts if front.admitted]
    if admitted:
        steps.append(
            Move(
                "Stop the runtimes whose start the gate admits (they start again once it is up):",
                tuple(f"sudo systemctl stop {front.unit}" for front in admitted),
                without_drop_ins(admitted, "start"),
            )
        )
    for front in plan.fronts:
        if front.drop_in is None:
            steps.append(_by_hand(front, out))
    steps.append(_gate(plan, out))
    if admitted:
        steps.append(
            Move(
                "Start the admitted runtimes (each start waits for its lease):",
                tuple(f"sudo systemctl start {front.unit}" for front in admitted),
                "sudo systemctl stop " + " ".join(str(front.unit) for front in admitted),
            )
        )
    checks = [f"{options.gpugate} status --config {CONFIG_PATH}"]
    for front in plan.fronts:
        checks.append(
            f"curl -s http://{_local(front)}{_probe_path(front)}    "
            f"# {front.name}, through the gate"
        )
    steps.append(Move("Check the budget and each runtime through the gate:", tuple(checks)))
    return steps


def _tokens(plan: Plan) -> list[Move]:
    """The control tokens still to make: none replaced (noclobber), the undo removes those."""
    wanted = [("control", CONTROL_TOKEN)] + ([("admit", ADMIT_TOKEN)] if plan.admits else [])
    missing = [(name, path) for name, path in wanted if path not in plan.present]
    there = [path for name, path in wanted if path in plan.present]
    if not missing:
        return []
    names = " ".join(name for name, _ in missing)
    title = "Make the control tokens, each in a file only root can read"
    if plan.admits:
        title += " (admit: for `gpugate admit` of the runtimes whose start is admitted)"
    if there:
        title += f" ({', '.join(there)} is there already and is kept)"
    return [
        Move(
            title + ":",
            (
                f"sudo sh -c 'umask 077; set -C; for name in {names}; do "
                f"openssl rand -hex 32 > {TOKEN_DIRECTORY}/$name.token; done'",
            ),
            _remove([path for _, path in missing]),
        )
    ]


def _by_hand(front: Front, out: str) -> Move:
    """A runtime without a drop-in: a container's port, one the gate starts, or one started
    by hand, started again on loopback."""
    process = front.found.process
    up = f"127.0.0.1:{front.upstream_port}"
    if process.container is not None:
        return Move(
            f"Publish {front.name}'s container port on {up} instead of {front.was} (its "
            f"container is {process.container}); to undo, publish it on {front.was} again."
        )
    if not process.namespaces.same_net:
        return Move(
            f"Forward {front.name}'s port from its network namespace to {up} here instead of "
            f"{front.was}; to undo, forward it to {front.was} again."
        )
    hand = front.hand
    assert hand is not None
    as_user = f" as {hand.user}" if hand.user else ""
    if front.control_command:
        return Move(
            f"Stop {front.name} (pid {process.pid}); the gate starts it itself as "
            f"control.command says. Its undo, once the gate is stopped, starts it as it "
            f"was{as_user}:",
            (f"kill {process.pid}",),
            hand.command(process.argv),
        )
    argv = front.new_argv if front.new_argv is not None else process.argv
    kept = []
    if process.cwd is not None:
        kept.append("in its working directory")
    if hand.env_path is not None:
        kept.append(f"with its environment ({out}/{hand.env_file}, mode 0600)")
    how = " and ".join(kept) if kept else "as it was started"
    hidden = f", with your values in place of {HIDDEN}" if HIDDEN in redact(argv) else ""
    return Move(
        f"Stop {front.name} (pid {process.pid}, started outside systemd) and start it again "
        f"on loopback, {how}{as_user}{hidden}. Its undo, once the one started here is "
        "stopped (Ctrl-C where it runs), starts it as it was:",
        (f"kill {process.pid}", hand.command(argv, front.new_env)),
        hand.command(process.argv),
    )


SANDBOX_HIDDEN = ("/home", "/root", "/run/user", "/tmp", "/var/tmp")
"""Where the unit's sandbox hides files from the gate (ProtectHome=, PrivateTmp=)."""


def _gate(plan: Plan, out: str) -> Move:
    options = plan.options
    unit = f"{out}/{GATE_UNIT_FILE}"
    enable = "sudo systemctl enable --now gpugate.service"
    disable = "sudo systemctl disable --now gpugate.service"
    if GATE_UNIT_PATH in plan.present:
        credential = (
            "" if plan.admits else "; no start is admitted here: drop its admit.token credential"
        )
        return Move(
            f"Start the gate: {GATE_UNIT_PATH} is there already, and init does not replace it "
            f"(compare it with {unit}, and check that it serves {CONFIG_PATH}){credential}:",
            (enable,),
            disable,
        )
    hidden = [d for d in SANDBOX_HIDDEN if options.gpugate.startswith(d + "/")]
    caveat = (
        f"; {options.gpugate} is under {hidden[0]}, which the unit's sandbox hides "
        "(ProtectHome=, PrivateTmp=): install gpugate elsewhere (a virtualenv in /opt, or "
        "/usr/local) and run init with that gpugate, or the gate will not start"
        if hidden
        else ""
    )
    return Move(
        f"Install and start the gate: {unit} is gpugate's packaged unit with this gpugate "
        f"({options.gpugate}) as its program{caveat}:",
        (
            f"sudo install -m 0644 {shlex.quote(unit)} {GATE_UNIT_PATH}",
            "sudo systemctl daemon-reload",
            enable,
        ),
        _and(disable, f"sudo rm -f {GATE_UNIT_PATH}", "sudo systemctl daemon-reload"),
    )


def _local(front: Front) -> str:
    host = front.listen_host
    if host in ("0.0.0.0", "[::]"):
        host = "127.0.0.1"
    return f"{host}:{front.listen_port}"


PROBE_PATHS = {
    "ollama": "/api/version",
    "comfyui": "/system_stats",
    "whisper": "/health",
    "llama": "/health",
    "vllm": "/health",
}


def _probe_path(front: Front) -> str:
    return PROBE_PATHS.get(front.found.kind, "/")
