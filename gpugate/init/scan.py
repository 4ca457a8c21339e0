"""Reading a host for `gpugate init`: typed records of what NVML, /proc and systemd show.

Everything here only reads. What cannot be read is left empty and said so (`env is None`,
`cwd is None`, a device list with `nvml_error`), never guessed: another user's
/proc/PID/environ, fd/ and cwd need root (or CAP_SYS_PTRACE), and a container's sockets
live in its own network namespace, which /proc/net/tcp of this one does not list. Each
process's namespaces are compared with init's own (namespaces.py), so that what runs in
another is told apart. The processes and sockets are /proc's (proc.py), the units
systemd's (systemd.py); NVML's cards, the whole host and what a runtime itself says are here.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

import attrs

from gpugate.init.namespaces import HERE, Namespaces, OwnNamespaces
from gpugate.init.proc import Listener, Process, read_listeners, read_processes


@attrs.frozen
class Device:
    """One card as NVML reports it."""

    index: int
    name: str
    uuid: str
    total: int
    reserved: int
    used: int


@attrs.frozen
class GpuProcess:
    """One PID holding memory on one card (NVML's compute and graphics lists merged)."""

    pid: int
    gpu: int
    used: int | None
    """Bytes, or None where the driver cannot tell."""


@attrs.frozen
class HostScan:
    """Everything `gpugate init` read from a host."""

    hostname: str
    proc_root: Path
    driver_version: str = ""
    devices: tuple[Device, ...] = ()
    gpu_processes: tuple[GpuProcess, ...] = ()
    nvml_error: str = ""
    processes: Mapping[int, Process] = attrs.field(factory=dict)
    listeners: tuple[Listener, ...] = ()
    """The listening sockets of init's own network namespace."""
    own: Namespaces = HERE
    """Init's own namespaces, as /proc shows them (for what it prints)."""

    @property
    def ports_in_use(self) -> frozenset[int]:
        """Every port something listens on in this network namespace."""
        return frozenset(listener.port for listener in self.listeners)

    def listeners_of(self, pid: int) -> list[Listener]:
        """The listening sockets process `pid` holds, lowest port first."""
        process = self.processes.get(pid)
        if process is None:
            return []
        held = [li for li in self.listeners if li.inode in process.sockets]
        return sorted(held, key=lambda li: (li.port, li.host))

    def ancestry(self, pid: int) -> list[Process]:
        """The process and its parents, nearest first (PID 1 and beyond left out)."""
        chain: list[Process] = []
        seen: set[int] = set()
        current = self.processes.get(pid)
        while current is not None and current.pid not in seen and current.pid > 1:
            chain.append(current)
            seen.add(current.pid)
            current = self.processes.get(current.ppid) if current.ppid else None
        return chain


# -- NVML ------------------------------------------------------------------------------


def read_nvml(
    library: Path | None,
) -> tuple[str, tuple[Device, ...], tuple[GpuProcess, ...], str]:
    """(driver version, devices, GPU processes, error) from one NVML sample."""
    from gpugate.gpu.nvml import NvmlError, NvmlReader, library_from

    try:
        with NvmlReader(library_from(library)) as reader:
            sample = reader.read()
    except NvmlError as exc:
        return "", (), (), str(exc)
    devices = tuple(
        Device(d.index, d.name, d.uuid, d.total, d.reserved, d.used) for d in sample.devices
    )
    processes = tuple(
        GpuProcess(p.pid, d.index, p.used) for d in sample.devices for p in d.processes
    )
    faults = [
        f"GPU {d.index}: {d.process_fault.message}" for d in sample.devices if d.process_fault
    ]
    return sample.driver_version, devices, processes, "; ".join(faults)


# -- the whole host --------------------------------------------------------------------


def scan_host(
    proc_root: Path = Path("/proc"), nvml_library: Path | None = None, hostname: str = ""
) -> HostScan:
    """One reading of the host: NVML first (its PIDs), then /proc."""
    driver, devices, gpu_processes, error = read_nvml(nvml_library)
    own = OwnNamespaces.read()
    return HostScan(
        hostname=hostname or os.uname().nodename,
        proc_root=proc_root,
        driver_version=driver,
        devices=devices,
        gpu_processes=gpu_processes,
        nvml_error=error,
        processes=read_processes(proc_root, own),
        listeners=read_listeners(proc_root),
        own=own.shown,
    )


# -- what a runtime itself says ----------------------------------------------------------


@attrs.frozen
class LoadedModel:
    """A model a runtime holds now, as it reports it."""

    name: str
    vram: int


def ask_ollama_ps(host: str, port: int, timeout: float = 2.0) -> tuple[list[LoadedModel], str]:
    """Ollama's `GET /api/ps`: the models it holds and their VRAM; ([], why) when it does
    not answer. An address bound to every interface is asked on loopback."""
    import json
    import urllib.error
    import urllib.request

    if host in ("0.0.0.0", "::", ""):
        host = "127.0.0.1"
    shown = f"[{host}]" if ":" in host else host
    url = f"http://{shown}:{port}/api/ps"
    try:
        with urllib.request.urlopen(url, timeout=timeout) as answer:
            body = json.loads(answer.read(1 << 20))
    except (OSError, ValueError, urllib.error.URLError) as exc:
        return [], f"GET {url}: {exc}"
    models = []
    entries = body.get("models") if isinstance(body, dict) else None
    for entry in entries if isinstance(entries, list) else []:
        if not isinstance(entry, dict):
            continue
        name = entry.get("name") or entry.get("model")
        vram = entry.get("size_vram")
        if isinstance(name, str) and isinstance(vram, int) and vram > 0:
            models.append(LoadedModel(name, vram))
    return models, ""


COMFYUI_FOLDERS = (
    "checkpoints",
    "diffusion_models",
    "unet",
    "text_encoders",
    "clip",
    "vae",
    "loras",
    "controlnet",
    "upscale_models",
    "clip_vision",
    "style_models",
    "gligen",
    "hypernetworks",
    "photomaker",
)
"""ComfyUI's model folders whose files a prompt loads onto the card."""
COMFYUI_EXTENSIONS = (".safetensors", ".sft", ".ckpt", ".pt", ".pt2", ".pth", ".bin", ".gguf")
COMFYUI_MAX_FILES = 400


def comfyui_model_files(models_dir: Path) -> list[tuple[str, int]]:
    """(FOLDER/NAME, bytes on disk) of each model file under ComfyUI's models folder."""
    found: list[tuple[str, int]] = []
    for folder in COMFYUI_FOLDERS:
        top = models_dir / folder
        if not top.is_dir():
            continue
        for dirpath, _dirs, files in os.walk(top, followlinks=True):
            for name in sorted(files):
                if not name.lower().endswith(COMFYUI_EXTENSIONS):
                    continue
                path = Path(dirpath) / name
                try:
                    size = path.stat().st_size
                except OSError:
                    continue
                found.append((f"{folder}/{path.relative_to(top).as_posix()}", size))
                if len(found) >= COMFYUI_MAX_FILES:
                    return sorted(found)
    return sorted(found)
