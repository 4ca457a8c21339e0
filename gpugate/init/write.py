"""The text `gpugate init` writes: consumers.yaml, one drop-in per runtime unit, the moves.

`render_files(plan)` returns them by path (under --out); `dry_run_text` prints them all,
each after a `==> PATH <==` line (as `head` prints several files), and `split_dry_run`
reads such a print back.
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Iterable

import yaml

from gpugate.core.units import GiB
from gpugate.init.plan import (
    ADMIT_TOKEN,
    ADMIT_WAIT,
    BUDGET_RESERVE,
    CONFIG_PATH,
    CONTROL_TOKEN,
    DROP_IN,
    Front,
    Options,
    Plan,
    mib,
)
from gpugate.init.scan import HIDDEN, redact

CONFIG_FILE = "consumers.yaml"
MOVES_FILE = "moves.txt"
HEADER = re.compile(r"^==> (?P<path>.+) <==$")

_PLAIN = re.compile(r"^[A-Za-z0-9_./@-][A-Za-z0-9_./@:+-]*$")
_SYSTEMD_PLAIN = re.compile(r"^[A-Za-z0-9_@%+=:,./-]+$")

LATE_NAME_REASON = f"zz-{DROP_IN} rather than {DROP_IN} to apply after"

RUNTIME_TITLES = {
    "ollama": "Ollama",
    "comfyui": "ComfyUI",
    "whisper": "whisper.cpp's whisper-server",
    "llama": "llama.cpp's llama-server",
    "vllm": "vLLM",
}


def scalar(text: str) -> str:
    """`text` as a YAML scalar: plain where YAML reads it back unchanged, else quoted."""
    if _PLAIN.match(text):
        try:
            if yaml.safe_load(text) == text:
                return text
        except yaml.YAMLError:
            pass
    return json.dumps(text)


def size(nbytes: int) -> str:
    """A size as the configuration writes it: whole GiB, else whole MiB (rounded up)."""
    if nbytes and nbytes % GiB == 0:
        return f"{nbytes // GiB}GiB"
    return f"{mib(nbytes)}MiB"


def gib(nbytes: int) -> str:
    return f"{nbytes / GiB:.1f} GiB"


def systemd_word(word: str) -> str:
    """One word of a systemd command line: `%` and `$` doubled, quoted when it must be."""
    escaped = word.replace("%", "%%").replace("$", "$$")
    if _SYSTEMD_PLAIN.match(escaped):
        return escaped
    return '"' + escaped.replace("\\", "\\\\").replace('"', '\\"') + '"'


def systemd_command(argv: Iterable[str]) -> str:
    return " ".join(systemd_word(word) for word in argv)


def _comment_lines(text: str, indent: str = "", width: int = 92) -> list[str]:
    """`text` as `# ` comment lines of at most about `width` characters."""
    lines: list[str] = []
    current = ""
    for word in text.split():
        if current and len(indent) + 2 + len(current) + 1 + len(word) > width:
            lines.append(f"{indent}# {current}")
            current = word
        else:
            current = f"{current} {word}" if current else word
    if current:
        lines.append(f"{indent}# {current}")
    return lines


def _with_comment(line: str, comment: str, column: int = 36) -> str:
    """`line  # comment`, the comment at `column` where the line leaves room (YAML needs a
    space before a comment's `#`)."""
    return f"{line.ljust(column - 2)}  # {comment}" if comment else line


# -- consumers.yaml ------------------------------------------------------------------------


def config_text(plan: Plan) -> str:
    """The consumers.yaml that puts the gate in front of every runtime found."""
    scan, options = plan.scan, plan.options
    out: list[str] = []
    driver = f"driver {scan.driver_version}" if scan.driver_version else "NVML"
    out += _comment_lines(
        f"gpugate configuration for {scan.hostname}, written by `gpugate init` from what the "
        f"host showed: {driver}, /proc and systemd. Review it and check it (`gpugate check "
        f"consumers.yaml`); every field is described in docs/configuration.md. The moves that "
        f"put the gate in front (drop-ins, restarts, in order) are in {MOVES_FILE}."
    )
    out.append("")
    if scan.devices:
        out.append("gpus:")
        for device in scan.devices:
            out.append(
                _with_comment(
                    f"  - index: {device.index}",
                    f"{device.name}, {gib(device.total)}",
                )
            )
        out.append("")
    out += [
        "budget:",
        _with_comment(
            f"  reserve: {BUDGET_RESERVE}", "always kept free, on top of everything counted"
        ),
        _with_comment("  reserve_max: 2GiB", "grows up to this while external use jumps"),
        "",
        "gate:",
        _with_comment(f"  control: {plan.control}", "/metrics, /gate/v1/ and the dashboard"),
        _with_comment(f"  database: {scalar(options.database)}", "measured envelopes, history"),
        "  control_tokens:",
        _with_comment(
            f"    - credential:control.token:{CONTROL_TOKEN}", "the operator's: every scope"
        ),
    ]
    if plan.admits:
        out.append(
            f'    - {{token: "credential:admit.token:{ADMIT_TOKEN}", scopes: [admit]}}'
            "  # gpugate admit's"
        )
    if options.proc_root is not None and str(options.proc_root) != "/proc":
        out.append(
            _with_comment(f"  proc_root: {scalar(str(options.proc_root))}", "as init read it")
        )
    if options.nvml_library is not None:
        out.append(
            _with_comment(
                f"  nvml_library: {scalar(str(options.nvml_library))}",
                "the library init read; drop it on a host with NVIDIA's driver",
            )
        )
    out.append("")
    if plan.fronts:
        out.append("consumers:")
        for front in plan.fronts:
            out += _consumer(front)
    else:
        out += _comment_lines("No runtime was found to front (see moves.txt).")
        out.append("consumers: {}")
        out.append("")
    if plan.services:
        out += _comment_lines(
            "GPU users the gate does not manage: their memory is observed and budgeted, "
            "never touched."
        )
        out.append("external:")
        for service in plan.services:
            found = service.found
            now = found.bytes_now
            held = f"{mib(now)} MiB on the card now" if now else "nothing on the card now"
            out += _comment_lines(
                f"Found: pid {found.process.pid} `{found.process.command}`"
                + (f", unit {service.unit}" if service.unit else "")
                + f", {len(found.members)} process(es); {held}.",
                "  ",
            )
            out.append(f"  {service.name}:")
            out.append("    processes:")
            if service.unit:
                out.append(f"      units: [{scalar(service.unit)}]")
            out.append(f"      commands: [{', '.join(json.dumps(c) for c in found.rule.commands)}]")
        out.append("")
    return "\n".join(out).rstrip("\n") + "\n"


def _consumer(front: Front) -> list[str]:
    found = front.found
    process = found.process
    address = found.address
    assert address is not None
    lines: list[str] = []
    held = ""
    if found.bytes_now:
        count = len(found.gpu_use)
        held = f"; {mib(found.bytes_now)} MiB on the card now, in {count} process" + (
            "es" if count != 1 else ""
        )
    found_text = (
        f"Found: pid {process.pid} `{process.command}`"
        + (f", unit {front.unit}" if front.unit else "")
        + f", listening on {front.was} ({address.source}){held}."
    )
    lines += _comment_lines(found_text, "  ")
    for note in front.notes:
        lines += _comment_lines(f"Note: {note}.", "  ")
    runtime = found.rule.runtime
    assert runtime is not None
    lines.append(f"  {front.name}:")
    lines.append(f"    runtime: {runtime}")
    lines.append(_with_comment(f"    listen: {front.listen}", "where its clients connect now"))
    moved = "its drop-in moves it here" if front.drop_in is not None else "it moves here"
    lines.append(_with_comment(f"    upstream: {front.upstream}", moved))
    if front.gpus:
        lines.append(f"    gpus: [{', '.join(map(str, front.gpus))}]")
    else:
        lines.append(f"    gpu: {front.gpu}")
    klass_note = {
        "comfyui": "as the chat runtimes: a render may evict their idle models",
        "llama": "embeddings" if front.klass == "background" else "",
        "vllm": "embeddings" if front.klass == "background" else "",
    }.get(found.kind, "")
    lines.append(_with_comment(f"    class: {front.klass}", klass_note))
    if front.ttl is not None:
        residency = f"    residency: {{policy: {front.policy}, ttl: {front.ttl}}}"
    else:
        residency = f"    residency: {{policy: {front.policy}}}"
    policy_note = {
        "always_warm": "holds its model from start to exit",
        "load_on_demand": "the gate calls /free once its queue is empty",
    }.get(front.policy, "")
    lines.append(_with_comment(residency, policy_note))
    if front.envelope is not None:
        lines.append(_with_comment(f"    envelope: {size(front.envelope)}", front.envelope_note))
    if front.max_body is not None:
        lines.append(_with_comment(f"    max_body: {size(front.max_body)}", "--max-upload-size"))
    lines.append("    processes:")
    if front.unit:
        lines.append(f"      units: [{scalar(front.unit)}]")
    lines.append(f"      commands: [{', '.join(json.dumps(c) for c in front.commands)}]")
    if front.admitted:
        assert front.unit is not None
        lines.append(_with_comment("    control:", "freed only by exiting: eviction is a stop"))
        lines.append(
            _with_comment(f"      unit: {scalar(front.unit)}", "its ExecStart runs `gpugate admit`")
        )
        lines.append("      start_admission_timeout: 2m")
    elif front.control_command:
        lines.append("    control:")
        words = ", ".join(json.dumps(word) for word in front.control_command)
        lines.append(f"      command: [{words}]")
    if found.kind == "comfyui" and (front.files or front.cors_header is not None):
        lines.append(_with_comment("    comfyui:", "ComfyUI's own settings"))
        if front.cors_header is not None:
            lines.append(
                _with_comment(
                    f"      cors_header: {json.dumps(front.cors_header)}", "--enable-cors-header"
                )
            )
        if front.files:
            lines.append(_with_comment("      files:", front.files_note))
            for key, nbytes in front.files:
                lines.append(f"        {scalar(_glob_literal(key))}: {size(nbytes)}")
            lines += _comment_lines(
                "A model's VRAM once loaded is about its file's size; the gate measures each "
                "prompt's peak and prefers it.",
                "      ",
            )
    if front.origins:
        origins = ", ".join(json.dumps(o) for o in front.origins)
        lines.append(_with_comment("    ollama:", "Ollama's own settings"))
        lines.append(_with_comment(f"      origins: [{origins}]", "its OLLAMA_ORIGINS"))
    if front.models:
        lines.append(_with_comment("    models:", "loaded now (GET /api/ps): VRAM as it reports"))
        for model in front.models:
            lines.append(f"      {scalar(model.name)}: {{envelope: {size(model.vram)}}}")
    elif found.kind == "ollama" and front.models_note:
        lines += _comment_lines(f"Its models could not be listed ({front.models_note}).", "    ")
    lines.append("")
    return lines


def _glob_literal(name: str) -> str:
    """A file name as a `files` key: glob characters made literal."""
    return re.sub(r"([*?\[])", r"[\1]", name)


# -- drop-ins ------------------------------------------------------------------------------


def drop_in_text(front: Front, options: Options) -> str:
    """The systemd drop-in that moves `front`'s runtime to its loopback port."""
    later = front.drop_in.after if front.drop_in is not None else ()
    title = RUNTIME_TITLES.get(front.found.kind, front.found.kind)
    lines = _comment_lines(
        f"{title} behind the gate, written by `gpugate init` for {front.unit}: it moves from "
        f"{front.was} to loopback 127.0.0.1:{front.upstream_port}, and the gate takes "
        f"{front.listen}."
    )
    if later:
        lines += _comment_lines(
            f"Named {LATE_NAME_REASON} {', '.join(later)} (drop-ins apply in file-name order)."
        )
    unit_lines: list[str] = []
    service: list[str] = []
    if front.found.kind == "ollama":
        lines += _comment_lines(
            "OLLAMA_KEEP_ALIVE=-1: the gate sets keep_alive on every /api/* request and "
            "unloads /v1/* models itself, so Ollama's own timer must never fire first."
        )
    admit = [
        options.gpugate, "admit", front.name, "--wait", ADMIT_WAIT, "--config", CONFIG_PATH,
    ]  # fmt: skip
    # With the unit's command known, `gpugate admit ... -- COMMAND` is the main process (it
    # becomes the command once admitted), so RestartPreventExitStatus= judges its refusals.
    exec_form = front.admitted and front.new_argv is not None
    if front.admitted:
        how = (
            f"its ExecStart asks the gate for a start lease for the consumer's envelope, then "
            f"becomes the runtime; when none comes within {ADMIT_WAIT} it exits 75 and is retried"
            if exec_form
            else "ExecStartPre asks the gate for a start lease for the consumer's envelope and "
            f"fails (status 75) when none comes within {ADMIT_WAIT}"
        )
        lines += _comment_lines(
            "It loads its model before it binds its port and holds it until it exits, so its "
            f"start is admitted like a load: {how}."
        )
        unit_lines = [
            "# The gate must be up to admit the start.",
            "Wants=gpugate.service",
            "After=gpugate.service",
        ]
        service += [
            "# `gpugate admit` presents the admit-only token, passed as a credential.",
            f"LoadCredential=gpugate-token:{ADMIT_TOKEN}",
        ]
        if not exec_form:
            service.append("ExecStartPre=" + systemd_command(admit))
    for key, value in front.new_env:
        service.append(f"Environment={systemd_word(f'{key}={value}')}")
    if front.new_argv is not None:
        source = (
            "its unit's command (systemctl show)"
            if front.unit_info is not None and front.unit_info.known and front.unit_info.exec_start
            else "the command it runs now"
        )
        service += [
            f"# {source[0].upper() + source[1:]}, with only its address changed. ExecStart= is a",
            "# list: the empty line clears the unit's own command before the new one.",
            "ExecStart=",
            "ExecStart="
            + systemd_command([*admit, "--", *front.new_argv] if exec_form else front.new_argv),
        ]
    if exec_form:
        service += [
            "# No room yet (75) or no gate (69) is retried after RestartSec, like a crash; a",
            "# refused token (77), a bad consumers.yaml or command line (78, 64, 65) stops it.",
            "Restart=on-failure",
            "RestartSec=10s",
            "RestartPreventExitStatus=64 65 77 78",
        ]
    elif front.admitted:
        service += [
            "# The admission wait counts towards the start timeout: keep it above --wait.",
            "TimeoutStartSec=6m",
            "# A refused admission is retried after RestartSec, like a crash.",
            "Restart=on-failure",
            "RestartSec=10s",
        ]
    if unit_lines:
        lines += ["[Unit]", *unit_lines, ""]
    lines += ["[Service]", *service]
    return "\n".join(lines) + "\n"


# -- the moves -----------------------------------------------------------------------------


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
        lines.append(f"  {found.kind:<10} pid {found.process.pid:<7} not fronted: {why}")
    for unknown in plan.recognised.unknown:
        used = f"{mib(unknown.used)} MiB" if unknown.used is not None else "? MiB"
        lines.append(
            f"  unknown: pid {unknown.pid}, {unknown.command}, {used} on GPU {unknown.gpu}"
        )
    if plan.recognised.unknown:
        lines += _wrap(
            "  (left out of consumers.yaml: its memory counts as external 'other'; give it a "
            "consumer or an external entry by hand)",
            "   ",
        )
    lines.append("")
    steps = _steps(plan, str(out))
    lines += _wrap(
        f"Moves, in order. gpugate init ran none of them; the files they install are those "
        f"it writes into {out}/ (without --dry-run).",
        "",
    )
    for number, (title, commands) in enumerate(steps, 1):
        lines.append("")
        wrapped = _wrap(f"{number}. {title}", "   ")
        lines += wrapped
        lines += [f"     {command}" for command in commands]
    notes = list(plan.notes)
    for front in plan.fronts:
        notes += [f"{front.name}: {note}" for note in front.notes]
    if notes:
        lines.append("")
        lines.append("Notes:")
        for note in notes:
            lines += _wrap(f"* {note}", "  ")
    return "\n".join(lines) + "\n"


def _wrap(text: str, indent: str, width: int = 92) -> list[str]:
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
        if front.control_command:
            steps.append(
                (
                    f"Stop {front.name} (pid {process.pid}); the gate starts it itself as "
                    "control.command says:",
                    [f"kill {process.pid}"],
                )
            )
            continue
        env = " ".join(f"{k}={shlex.quote(v)}" for k, v in front.new_env)
        argv = redact(front.new_argv if front.new_argv is not None else process.argv)
        steps.append(
            (
                f"Stop {front.name} (pid {process.pid}, started outside systemd) and start it "
                "again on loopback, the way it was started, as"
                + (f" (with your values for {HIDDEN})" if HIDDEN in argv else "")
                + ":",
                [f"kill {process.pid}", (env + " " if env else "") + shlex.join(argv)],
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


# -- files and the dry run -----------------------------------------------------------------


def render_files(plan: Plan) -> dict[str, str]:
    """Every file init writes, by its path under --out, in the order they are printed."""
    files = {CONFIG_FILE: config_text(plan)}
    for front in plan.fronts:
        if front.drop_in is not None:
            files[front.drop_in.path] = drop_in_text(front, plan.options)
    files[MOVES_FILE] = moves_text(plan)
    return files


def dry_run_text(files: dict[str, str]) -> str:
    """Every file, each after a `==> PATH <==` line."""
    parts = [f"==> {path} <==\n{text}" for path, text in files.items()]
    return "\n".join(parts)


def split_dry_run(text: str) -> dict[str, str]:
    """The files of a dry run's print, by path."""
    files: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in text.splitlines(keepends=True):
        match = HEADER.match(line.rstrip("\n"))
        if match:
            current = files.setdefault(match["path"], [])
            continue
        if current is not None:
            current.append(line)
    result = {}
    for path, lines in files.items():
        body = "".join(lines)
        # dry_run_text puts one blank line between files.
        result[path] = body[:-1] if body.endswith("\n\n") else body
    return result
