"""The systemd files `gpugate init` writes: each runtime unit's drop-in, the gate's unit."""

from __future__ import annotations

from gpugate.init.plan import ADMIT_TOKEN, ADMIT_WAIT, CONFIG_PATH, DROP_IN, Front, Options, Plan
from gpugate.init.spelling import comment_lines, systemd_command, systemd_word
from gpugate.packaged import GATE_UNIT, SHIPPED_PROGRAM, shared

LATE_NAME_REASON = f"zz-{DROP_IN} rather than {DROP_IN} to apply after"

RUNTIME_TITLES = {
    "ollama": "Ollama",
    "comfyui": "ComfyUI",
    "whisper": "whisper.cpp's whisper-server",
    "llama": "llama.cpp's llama-server",
    "vllm": "vLLM",
}


# -- drop-ins ------------------------------------------------------------------------------


def drop_in_text(front: Front, options: Options) -> str:
    """The systemd drop-in that moves `front`'s runtime to its loopback port."""
    later = front.drop_in.after if front.drop_in is not None else ()
    title = RUNTIME_TITLES.get(front.found.kind, front.found.kind)
    lines = comment_lines(
        f"{title} behind the gate, written by `gpugate init` for {front.unit}: it moves from "
        f"{front.was} to loopback 127.0.0.1:{front.upstream_port}, and the gate takes "
        f"{front.listen}."
    )
    if later:
        lines += comment_lines(
            f"Named {LATE_NAME_REASON} {', '.join(later)} (drop-ins apply in file-name order)."
        )
    unit_lines: list[str] = []
    service: list[str] = []
    if front.found.kind == "ollama":
        lines += comment_lines(
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
        lines += comment_lines(
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
    head = comment_lines(
        f"gpugate's packaged unit (`gpugate share {GATE_UNIT}`), written by `gpugate init` "
        f"with {plan.options.gpugate} as its program"
        + ("" if plan.admits else f" and no {ADMIT_CREDENTIAL} (no start is admitted here)")
        + "."
    )
    return "\n".join([*head, *lines]) + "\n"
