"""moves.txt: what init found, and the moves that put the gate in front, in order.

Init runs none of them.
"""

from __future__ import annotations

import shlex

from gpugate.init.plan import CONFIG_FILE, CONFIG_PATH, Front, Plan, gib, mib
from gpugate.init.scan import HIDDEN, redact


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
    steps = _steps(plan, str(out))
    lines += wrap(
        f"Moves, in order. gpugate init ran none of them; the files they install are those "
        f"it writes into {out}/ (without --dry-run).",
        "",
    )
    for number, (title, commands) in enumerate(steps, 1):
        lines.append("")
        wrapped = wrap(f"{number}. {title}", "   ")
        lines += wrapped
        lines += [f"     {command}" for command in commands]
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


def _steps(plan: Plan, out: str) -> list[tuple[str, list[str]]]:
    options = plan.options
    steps: list[tuple[str, list[str]]] = []
    config = f"{out}/{CONFIG_FILE}"
    steps.append(
        (
            "Review the files, then install the configuration and check it:",
            [
                f"sudo install -D -m 0644 {shlex.quote(config)} {CONFIG_PATH}",
                f"{options.gpugate} check {CONFIG_PATH}",
            ],
        )
    )
    tokens = "control admit" if plan.admits else "control"
    steps.append(
        (
            "Make the control tokens, each in a file only root can read"
            + (
                " (admit: for `gpugate admit` of the runtimes whose start is admitted):"
                if plan.admits
                else ":"
            ),
            [
                f"sudo sh -c 'umask 077; for name in {tokens}; do "
                "openssl rand -hex 32 > /etc/gpugate/$name.token; done'"
            ],
        )
    )
    drop_ins = [front for front in plan.fronts if front.drop_in is not None]
    if drop_ins:
        commands = []
        for front in drop_ins:
            assert front.drop_in is not None
            commands.append(
                f"sudo install -D -m 0644 {shlex.quote(out + '/' + front.drop_in.path)} "
                f"{front.drop_in.install_path}"
            )
        commands.append("sudo systemctl daemon-reload")
        steps.append(("Install the drop-ins:", commands))
    moving = [front for front in drop_ins if not front.admitted]
    if moving:
        steps.append(
            (
                "Move each runtime to its loopback port (its clients get no answer until the "
                "gate is up):",
                [
                    f"sudo systemctl restart {front.unit}    "
                    f"# {front.was} -> 127.0.0.1:{front.upstream_port}"
                    for front in moving
                ],
            )
        )
    admitted = [front for front in plan.fronts if front.admitted]
    if admitted:
        steps.append(
            (
                "Stop the runtimes whose start the gate admits (they start again once it is up):",
                [f"sudo systemctl stop {front.unit}" for front in admitted],
            )
        )
    by_hand = [front for front in plan.fronts if front.drop_in is None]
    for front in by_hand:
        process = front.found.process
        if process.container is not None:
            steps.append(
                (
                    f"Publish {front.name}'s container port on 127.0.0.1:{front.upstream_port} "
                    f"instead of {front.was} (its container is {process.container}).",
                    [],
                )
            )
            continue
        if not process.namespaces.same_net:
            steps.append(
                (
                    f"Forward {front.name}'s port from its network namespace to "
                    f"127.0.0.1:{front.upstream_port} here instead of {front.was}.",
                    [],
                )
            )
            continue
        if front.control_command:
            steps.append(
                (
                    f"Stop {front.name} (pid {process.pid}); the gate starts it itself as "
                    "control.command says:",
                    [f"kill {process.pid}"],
                )
            )
            continue
        hand = front.hand
        assert hand is not None
        argv = front.new_argv if front.new_argv is not None else process.argv
        kept = []
        if process.cwd is not None:
            kept.append("in its working directory")
        if hand.env_path is not None:
            kept.append(f"with its environment ({out}/{hand.env_file}, mode 0600)")
        how = " and ".join(kept) if kept else "as it was started"
        as_user = f" as {hand.user}" if hand.user else ""
        hidden = f", with your values in place of {HIDDEN}" if HIDDEN in redact(argv) else ""
        steps.append(
            (
                f"Stop {front.name} (pid {process.pid}, started outside systemd) and start it "
                f"again on loopback, {how}{as_user}{hidden}:",
                [f"kill {process.pid}", hand.command(argv, front.new_env)],
            )
        )
    gate_unit = [
        "sudo install -m 0644 systemd/gpugate.service /etc/systemd/system/gpugate.service",
        "sudo systemctl daemon-reload",
        "sudo systemctl enable --now gpugate.service",
    ]
    title = (
        "Install and start the gate: systemd/gpugate.service from gpugate's source"
        + (
            f" (its ExecStart= names /usr/local/bin/gpugate; this one is {options.gpugate})"
            if options.gpugate != "/usr/local/bin/gpugate"
            else ""
        )
        + (
            ""
            if plan.admits
            else "; no start is admitted here: drop its LoadCredential=admit.token line"
        )
        + ":"
    )
    steps.append((title, gate_unit))
    if admitted:
        steps.append(
            (
                "Start the admitted runtimes (each start waits for its lease):",
                [f"sudo systemctl start {front.unit}" for front in admitted],
            )
        )
    checks = [f"{options.gpugate} status --config {CONFIG_PATH}"]
    for front in plan.fronts:
        checks.append(
            f"curl -s http://{_local(front)}{_probe_path(front)}    "
            f"# {front.name}, through the gate"
        )
    steps.append(("Check the budget and each runtime through the gate:", checks))
    return steps


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
