"""One consumer decided: its class, policy and envelope, the command it moves to, its control."""

from __future__ import annotations

import contextlib
import os
import shlex
from collections.abc import Mapping
from pathlib import Path

import attrs

from gpugate.core.units import MiB
from gpugate.init.addresses import Ports, gate_host, other_addresses, with_address
from gpugate.init.cmdline import has_flag, option, program_of
from gpugate.init.handstart import HandStart, env_path
from gpugate.init.plan import COMFYUI_RESERVE, DROP_IN, LATE_DROP_IN, DropIn, Front, Options, mib
from gpugate.init.proc import redact
from gpugate.init.recognise import Address, Found
from gpugate.init.rules import comfyui_base
from gpugate.init.scan import HostScan, LoadedModel, comfyui_model_files
from gpugate.init.systemd import UnitInfo
from gpugate.runtimes.footprint import Cap
from gpugate.runtimes.vllm.adapter import utilization_cap

MODEL_FILE_OVERHEAD = 1.25
"""A model file's size times this is the envelope guessed for a process holding nothing now
(weights plus compute buffers and a CUDA context); measured at its first start."""


def _model_file(found: Found) -> tuple[Path | None, int | None]:
    model = found.model
    if not model:
        return None, None
    path = Path(model)
    if not path.is_absolute():
        if found.process.cwd is None:
            return path, None
        path = found.process.cwd / path
    try:
        return path, path.stat().st_size
    except OSError:
        return path, None


def _process_envelope(found: Found) -> tuple[int | None, str]:
    """A process runtime's envelope: what it holds now, else its model file's size."""
    if found.bytes_now:
        where = ", ".join(f"GPU {g}" for g in found.gpus)
        return mib(found.bytes_now) * MiB, f"held now ({where}, NVML)"
    path, size = _model_file(found)
    if size:
        guess = int(size * MODEL_FILE_OVERHEAD)
        return mib(guess) * MiB, (
            f"not on the card now: {MODEL_FILE_OVERHEAD:g} x its model file ({path}, "
            f"{mib(size)} MiB); the gate measures it at its next start"
        )
    return None, ""


def _vllm_envelope(found: Found, scan: HostScan, gpu: int) -> tuple[int | None, str]:
    if found.bytes_now:
        return mib(found.bytes_now) * MiB, "held now (NVML)"
    share = option(found.args, ["--gpu-memory-utilization"]) or "0.9"
    device = next((d for d in scan.devices if d.index == gpu), None)
    try:
        fraction = float(share)
    except ValueError:
        fraction = 0.9
    if device is None:
        return None, ""
    return mib(int(device.total * fraction)) * MiB, (
        f"not on the card now: --gpu-memory-utilization {share} of GPU {gpu}"
    )


def _vllm_share(envelope: int, scan: HostScan, gpu: int) -> Cap | None:
    """`--gpu-memory-utilization`: the share of its card `envelope` is (None: no card)."""
    device = next((d for d in scan.devices if d.index == gpu), None)
    return utilization_cap(envelope, device.total) if device is not None else None


def _command_match(found: Found) -> tuple[str, ...]:
    """The string its processes' command lines contain (attribution's `commands`)."""
    program = found.program
    if found.kind == "ollama":
        return ("ollama serve",)
    if found.kind == "vllm":
        return ("vllm serve",) if program.module is None else (program.module,)
    if found.kind == "llama" and "/" not in program.word:
        # A bare `llama-server` would also match other programs' children named so (some
        # Ollama builds name their runners llama-server): the next word narrows it.
        args = found.args
        return (f"{program.word} {args[0]}",) if args else (program.word,)
    return (program.word,)


def _embedding(found: Found) -> bool:
    args = found.args
    if found.kind == "llama":
        return has_flag(args, ["--embedding", "--embeddings", "--reranking", "--rerank"])
    if found.kind == "vllm":
        return option(args, ["--task"]) in ("embed", "embedding", "score", "classify") or (
            option(args, ["--runner"]) == "pooling"
        )
    return False


def _ollama_gpus(found: Found, scan: HostScan) -> tuple[int, ...]:
    """The cards an Ollama may load on when there are several: every card when its
    environment hides none (no CUDA_VISIBLE_DEVICES), else those it holds memory on."""
    if found.kind != "ollama":
        return ()
    if len(scan.devices) > 1 and "CUDA_VISIBLE_DEVICES" not in found.env:
        return tuple(sorted(d.index for d in scan.devices))
    return tuple(sorted(found.gpus)) if len(found.gpus) > 1 else ()


def front_for(
    name: str,
    found: Found,
    address: Address,
    scan: HostScan,
    units: Mapping[str, UnitInfo],
    ports: Ports,
    default_gpu: int,
    loaded: Mapping[int, tuple[list[LoadedModel], str]],
    options: Options,
) -> Front | str:
    """One consumer, or why it is left out."""
    notes: list[str] = []
    host, host_note = gate_host(address.host)
    if host_note:
        notes.append(host_note)
    upstream_port = ports.next_free(address.port)
    gpu = found.gpus[0] if found.gpus else default_gpu
    gpus = _ollama_gpus(found, scan)
    if gpus:
        notes.append(
            "Ollama sees GPUs "
            + ", ".join(map(str, gpus))
            + " and places each model on one of them (or splits it) by its own rule; "
            "the gate leases where Ollama will load"
        )
    elif len(found.gpus) > 1:
        notes.append(
            "it holds memory on GPUs "
            + ", ".join(map(str, found.gpus))
            + f"; budgeted on GPU {gpu}, where it holds the most"
        )
    process = found.process
    unit = process.unit
    info = units.get(unit) if unit is not None else None
    movable = process.container is None and process.namespaces.same_net
    if process.container is not None:
        notes.append(
            f"it runs in a container ({process.container}): publish its port on "
            f"127.0.0.1:{upstream_port} instead of {address.port} (docker run -p "
            f"127.0.0.1:{upstream_port}:{address.port}); init writes no drop-in for it"
        )
    elif not process.namespaces.same_net:
        notes.append(
            f"it runs {process.namespaces.elsewhere(scan.own)}, proposed as named: the "
            f"address shown is in its namespace, and the gate, in this one, reaches it only "
            f"where that namespace's port is forwarded here; forward it to "
            f"127.0.0.1:{upstream_port} instead of {address.port}. Init writes no drop-in "
            "and no restart for it"
        )
    notes += other_addresses(found, address, host)
    klass = "background" if _embedding(found) else "interactive"
    values: dict = dict(
        name=name,
        found=found,
        listen_host=host,
        listen_port=address.port,
        upstream_port=upstream_port,
        gpu=gpu,
        gpus=gpus,
        klass=klass,
        commands=_command_match(found),
        unit=unit if movable else None,
        unit_info=info,
    )
    kind = found.kind
    if kind == "ollama":
        values.update(policy="keep_warm", ttl="15m")
        values["new_env"] = (
            ("OLLAMA_HOST", f"127.0.0.1:{upstream_port}"),
            ("OLLAMA_KEEP_ALIVE", "-1"),
        )
        origins = found.env.get("OLLAMA_ORIGINS", "")
        values["origins"] = tuple(o.strip() for o in origins.split(",") if o.strip())
        models, why = loaded.get(process.pid, ([], ""))
        values["models"] = tuple(models)
        values["models_note"] = why
        for_unit = info.environment if info is not None else {}
        if (
            "OLLAMA_HOST" in found.env
            and "OLLAMA_HOST" not in for_unit
            and info is not None
            and info.known
        ):
            files = ", ".join(info.environment_files) or "not the unit's Environment="
            notes.append(
                f"OLLAMA_HOST={found.env['OLLAMA_HOST']} comes from elsewhere ({files}): an "
                "EnvironmentFile= wins over the drop-in's Environment=; change it there"
            )
    elif kind == "comfyui":
        values.update(policy="load_on_demand")
        base = comfyui_base(process, found.program)
        files: list[tuple[str, int]] = []
        if base is not None and (base / "models").is_dir():
            files = comfyui_model_files(base / "models")
            values["files_note"] = f"sizes on disk in {base / 'models'}"
        else:
            where = base / "models" if base is not None else "its models folder (cwd unreadable)"
            values["files_note"] = f"{where} could not be read"
            notes.append(
                f"ComfyUI's model files could not be sized ({where}): give their sizes "
                "in files, or every file a prompt loads counts as 8 GiB"
            )
        values["files"] = tuple(files)
        if has_flag(found.args, ["--enable-cors-header"]):
            values["cors_header"] = option(found.args, ["--enable-cors-header"], flag_value="*")
        upload = option(found.args, ["--max-upload-size"])
        if upload is not None:
            with contextlib.suppress(ValueError):
                values["max_body"] = int(float(upload) * MiB)
    elif kind == "whisper":
        envelope, why = _process_envelope(found)
        values.update(policy="always_warm", envelope=envelope, envelope_note=why)
    elif kind == "llama":
        one_model = has_flag(
            found.args, ["-m", "--model", "-hf", "--hf-repo", "-mu", "--model-url"]
        )
        if one_model:
            envelope, why = _process_envelope(found)
            if envelope is None:
                return (
                    "llama-server with one model holds nothing on the card now and its model "
                    "file could not be read: its envelope is unknown"
                )
            values.update(policy="always_warm", envelope=envelope, envelope_note=why)
        else:
            values.update(policy="keep_warm", ttl="15m")
    elif kind == "vllm":
        envelope, why = _vllm_envelope(found, scan, gpu)
        if envelope is None:
            return "vLLM needs an envelope and NVML showed no card to size it from"
        values.update(envelope=envelope, envelope_note=why)
        if has_flag(found.args, ["--enable-sleep-mode"]):
            values.update(policy="keep_warm", ttl="15m")
            if found.env.get("VLLM_SERVER_DEV_MODE") != "1":
                values["new_env"] = (("VLLM_SERVER_DEV_MODE", "1"),)
        else:
            values.update(policy="always_warm")
            notes.append(
                "vLLM runs without --enable-sleep-mode: the gate cannot take its memory back "
                "(its eviction is a sleep); add the flag and VLLM_SERVER_DEV_MODE=1 to evict it"
            )
    # How it starts after the move: its unit's command (or its own), address changed.
    base_argv: tuple[str, ...] = process.argv
    if info is not None and info.known and info.exec_start:
        base_argv = info.exec_start
        unit_program = program_of(base_argv)
        if unit_program is None or unit_program.name != found.program.name:
            notes.append(
                f"{unit} runs {shlex.join(redact(base_argv))}, which started "
                f"{process.command}: the drop-in replaces the unit's command with the "
                "runtime's own; check it, or move the address where the unit's command sets it"
            )
            base_argv = process.argv
    elif unit is not None and movable:
        why = info.error if info is not None and info.error else "systemd does not know it"
        notes.append(f"systemctl show {unit}: {why}; the drop-in uses the running command line")
    if kind != "ollama" and movable:
        values["new_argv"] = with_address(base_argv, found, upstream_port)
        if kind == "comfyui":
            # ComfyUI sizes its loads to the free memory less this (partial loads, Dynamic
            # VRAM): it must leave the gate's reserve free, as the gate does.
            values["new_argv"] = COMFYUI_RESERVE.onto(values["new_argv"], {}).argv
        elif kind == "vllm":
            # vLLM takes this share of the card's total at start, whatever its version's
            # default: the envelope the gate leases it, unless its command says its own.
            share = _vllm_share(values["envelope"], scan, gpu)
            if share is not None:
                values["new_argv"] = share.onto(values["new_argv"], {}).argv
    envelope_known = values.get("envelope") is not None
    if process.user_unit and kind == "llama" and values["policy"] == "always_warm":
        return (
            f"a one-model llama-server in a user unit ({unit}): the gate starts and stops only "
            "system units and its own children; run it as a system unit"
        )
    if unit is not None and movable and not process.user_unit:
        values["admitted"] = (
            kind in ("whisper", "llama") and envelope_known and (values["policy"] == "always_warm")
        )
    elif (
        kind == "llama" and values["policy"] == "always_warm" and movable and values.get("new_argv")
    ):
        # A one-model llama-server is controlled as a process: outside systemd, the gate
        # runs it as its child.
        values["control_command"] = values["new_argv"]
        notes.append(
            "it runs outside systemd: the gate starts it itself (control.command); stop this "
            "one, and the gate starts it on the first request"
        )
    if process.user_unit:
        notes.append(
            f"{unit} is a user unit: install the drop-in as its user and use systemctl --user"
        )
    if movable and unit is None:
        hand = HandStart(
            name, process, env_path(options.out, name) if process.env is not None else None
        )
        values["hand"] = hand
        if not values.get("control_command"):
            notes += hand.notes()
    front = Front(**values, notes=tuple(notes))
    if front.unit is not None:
        front = attrs.evolve(front, drop_in=_drop_in_for(front))
    return front


def _drop_in_for(front: Front) -> DropIn:
    assert front.unit is not None
    info = front.unit_info
    later = tuple(
        os.path.basename(path)
        for path in (info.drop_in_paths if info is not None else ())
        if os.path.basename(path) > DROP_IN and os.path.basename(path) != LATE_DROP_IN
    )
    return DropIn(
        front.unit,
        LATE_DROP_IN if later else DROP_IN,
        later,
        user_unit=front.found.process.user_unit,
    )
