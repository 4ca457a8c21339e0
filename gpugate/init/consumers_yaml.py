"""The consumers.yaml `gpugate init` writes: each runtime found fronted, other GPU users."""

from __future__ import annotations

import json
import re

from gpugate.init.plan import (
    ADMIT_TOKEN,
    BUDGET_RESERVE,
    CONTROL_TOKEN,
    MOVES_FILE,
    Front,
    Plan,
    gib,
    mib,
)
from gpugate.init.spelling import comment_lines, scalar, size, with_comment


def config_text(plan: Plan) -> str:
    """The consumers.yaml that puts the gate in front of every runtime found."""
    scan, options = plan.scan, plan.options
    out: list[str] = []
    driver = f"driver {scan.driver_version}" if scan.driver_version else "NVML"
    out += comment_lines(
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
                with_comment(
                    f"  - index: {device.index}",
                    f"{device.name}, {gib(device.total)}",
                )
            )
        out.append("")
    out += [
        "budget:",
        with_comment(
            f"  reserve: {BUDGET_RESERVE}", "always kept free, on top of everything counted"
        ),
        with_comment("  reserve_max: 2GiB", "grows up to this while external use jumps"),
        "",
        "gate:",
        with_comment(f"  control: {plan.control}", "/metrics, /gate/v1/ and the dashboard"),
        with_comment(f"  database: {scalar(options.database)}", "measured envelopes, history"),
        "  control_tokens:",
        with_comment(
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
            with_comment(f"  proc_root: {scalar(str(options.proc_root))}", "as init read it")
        )
    if options.nvml_library is not None:
        out.append(
            with_comment(
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
        out += comment_lines("No runtime was found to front (see moves.txt).")
        out.append("consumers: {}")
        out.append("")
    if plan.services:
        out += comment_lines(
            "GPU users the gate does not manage: their memory is observed and budgeted, "
            "never touched."
        )
        out.append("external:")
        for service in plan.services:
            found = service.found
            now = found.bytes_now
            held = f"{mib(now)} MiB on the card now" if now else "nothing on the card now"
            out += comment_lines(
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
    lines += comment_lines(found_text, "  ")
    for note in front.notes:
        lines += comment_lines(f"Note: {note}.", "  ")
    runtime = found.rule.runtime
    assert runtime is not None
    lines.append(f"  {front.name}:")
    lines.append(f"    runtime: {runtime}")
    lines.append(with_comment(f"    listen: {front.listen}", "where its clients connect now"))
    moved = "its drop-in moves it here" if front.drop_in is not None else "it moves here"
    lines.append(with_comment(f"    upstream: {front.upstream}", moved))
    if front.gpus:
        lines.append(f"    gpus: [{', '.join(map(str, front.gpus))}]")
    else:
        lines.append(f"    gpu: {front.gpu}")
    klass_note = {
        "comfyui": "as the chat runtimes: a render may evict their idle models",
        "llama": "embeddings" if front.klass == "background" else "",
        "vllm": "embeddings" if front.klass == "background" else "",
    }.get(found.kind, "")
    lines.append(with_comment(f"    class: {front.klass}", klass_note))
    if front.ttl is not None:
        residency = f"    residency: {{policy: {front.policy}, ttl: {front.ttl}}}"
    else:
        residency = f"    residency: {{policy: {front.policy}}}"
    policy_note = {
        "always_warm": "holds its model from start to exit",
        "load_on_demand": "the gate calls /free once its queue is empty",
    }.get(front.policy, "")
    lines.append(with_comment(residency, policy_note))
    if front.envelope is not None:
        lines.append(with_comment(f"    envelope: {size(front.envelope)}", front.envelope_note))
    if front.max_body is not None:
        lines.append(with_comment(f"    max_body: {size(front.max_body)}", "--max-upload-size"))
    lines.append("    processes:")
    if front.unit:
        lines.append(f"      units: [{scalar(front.unit)}]")
    lines.append(f"      commands: [{', '.join(json.dumps(c) for c in front.commands)}]")
    if front.admitted:
        assert front.unit is not None
        lines.append(with_comment("    control:", "freed only by exiting: eviction is a stop"))
        lines.append(
            with_comment(f"      unit: {scalar(front.unit)}", "its ExecStart runs `gpugate admit`")
        )
        lines.append("      start_admission_timeout: 2m")
    elif front.control_command:
        lines.append("    control:")
        words = ", ".join(json.dumps(word) for word in front.control_command)
        lines.append(f"      command: [{words}]")
    if found.kind == "comfyui" and (front.files or front.cors_header is not None):
        lines.append(with_comment("    comfyui:", "ComfyUI's own settings"))
        if front.cors_header is not None:
            lines.append(
                with_comment(
                    f"      cors_header: {json.dumps(front.cors_header)}", "--enable-cors-header"
                )
            )
        if front.files:
            lines.append(with_comment("      files:", front.files_note))
            for key, nbytes in front.files:
                lines.append(f"        {scalar(_glob_literal(key))}: {size(nbytes)}")
            lines += comment_lines(
                "A model's VRAM once loaded is about its file's size; the gate measures each "
                "prompt's peak and prefers it.",
                "      ",
            )
    if front.origins:
        origins = ", ".join(json.dumps(o) for o in front.origins)
        lines.append(with_comment("    ollama:", "Ollama's own settings"))
        lines.append(with_comment(f"      origins: [{origins}]", "its OLLAMA_ORIGINS"))
    if front.models:
        lines.append(with_comment("    models:", "loaded now (GET /api/ps): VRAM as it reports"))
        for model in front.models:
            lines.append(f"      {scalar(model.name)}: {{envelope: {size(model.vram)}}}")
    elif found.kind == "ollama" and front.models_note:
        lines += comment_lines(f"Its models could not be listed ({front.models_note}).", "    ")
    lines.append("")
    return lines


def _glob_literal(name: str) -> str:
    """A file name as a `files` key: glob characters made literal."""
    return re.sub(r"([*?\[])", r"[\1]", name)
