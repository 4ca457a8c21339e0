"""The text `gpugate init` writes: consumers.yaml, one drop-in per runtime unit, the gate's
unit (the packaged one, gpugate/share/systemd/gpugate.service, for this gpugate), the
environment of each runtime started by hand (handstart.py), the moves (moves.py).

`render_files(plan)` returns them by path (under --out); `dry_run_text` prints them all,
each after a `==> PATH <==` line (as `head` prints several files), and `split_dry_run`
reads such a print back. `private_files(plan)` names those to write with mode 0600.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable

import yaml

from gpugate.core.units import GiB
from gpugate.init.handstart import env_file_text
from gpugate.init.moves import moves_text
from gpugate.init.plan import (
    ADMIT_TOKEN,
    ADMIT_WAIT,
    BUDGET_RESERVE,
    CONFIG_FILE,
    CONFIG_PATH,
    CONTROL_TOKEN,
    DROP_IN,
    GATE_UNIT_FILE,
    MOVES_FILE,
    Front,
    Options,
    Plan,
    gib,
    mib,
)
from gpugate.packaged import GATE_UNIT, SHIPPED_PROGRAM, shared

__all__ = ["CONFIG_FILE", "MOVES_FILE", "dry_run_text", "render_files", "split_dry_run"]

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


# -- the gate's unit -----------------------------------------------------------------------

ADMIT_CREDENTIAL = f"LoadCredential=admit.token:{ADMIT_TOKEN}"


def gate_unit_text(plan: Plan) -> str:
    """The packaged gate unit, its program this gpugate, without the admit token's
    credential when no runtime's start is admitted (every LoadCredential= file must exist)."""
    shipped = shared(GATE_UNIT).read_text(encoding="utf-8")
    program = systemd_word(plan.options.gpugate)
    lines = [
        line.replace(SHIPPED_PROGRAM, program)
        for line in shipped.splitlines()
        if plan.admits or line != ADMIT_CREDENTIAL
    ]
    head = _comment_lines(
        f"gpugate's packaged unit (`gpugate share {GATE_UNIT}`), written by `gpugate init` "
        f"with {plan.options.gpugate} as its program"
        + ("" if plan.admits else f" and no {ADMIT_CREDENTIAL} (no start is admitted here)")
        + "."
    )
    return "\n".join([*head, *lines]) + "\n"


# -- files and the dry run -----------------------------------------------------------------


def render_files(plan: Plan, *, shown: bool = False) -> dict[str, str]:
    """Every file init writes, by its path under --out, in the order they are printed.

    `shown`: to print (the dry run): an environment file's secret-looking values as ***."""
    files = {CONFIG_FILE: config_text(plan)}
    for front in plan.fronts:
        if front.drop_in is not None:
            files[front.drop_in.path] = drop_in_text(front, plan.options)
    for front in plan.fronts:
        if front.hand is not None and front.hand.env_path is not None:
            files[front.hand.env_file] = env_file_text(front.hand, shown=shown)
    files[GATE_UNIT_FILE] = gate_unit_text(plan)
    files[MOVES_FILE] = moves_text(plan)
    return files


def private_files(plan: Plan) -> dict[str, int | None]:
    """The files to write with mode 0600 (a runtime's environment), by path, each with the
    user to own it (the runtime's, who runs the command that reads it; None: init's)."""
    return {
        front.hand.env_file: front.found.process.uid
        for front in plan.fronts
        if front.hand is not None and front.hand.env_path is not None
    }


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
