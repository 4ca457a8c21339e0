"""The rules: how each runtime and external GPU user is recognised, and where it listens."""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Sequence
from pathlib import Path

import attrs

from gpugate.init.cmdline import Program, option, program_of
from gpugate.init.proc import Process


def _comfyui_dir(process: Process, program: Program, scan_root: Path) -> bool:
    """main.py is ComfyUI's when its folder is named for it, or holds ComfyUI's own modules."""
    written = os.path.basename(os.path.normpath(os.path.dirname(program.word) or "."))
    base = comfyui_base(process, program)
    names = [written] + ([base.name] if base is not None else [])
    if any(re.search(r"(?i)comfy", name) for name in names):
        return True
    return base is not None and (base / "folder_paths.py").is_file() and (base / "comfy").is_dir()


def comfyui_base(process: Process, program: Program) -> Path | None:
    """ComfyUI's folder: `--base-directory`, else main.py's, against the process's cwd."""
    args = program.args(process.argv)
    given = option(args, ["--base-directory"])
    folder = Path(given) if given else Path(os.path.dirname(program.word) or ".")
    if not folder.is_absolute():
        if process.cwd is None:
            return None
        folder = process.cwd / folder
    return Path(os.path.normpath(folder))


@attrs.frozen
class Rule:
    """How one runtime (or external GPU user) is recognised, and where it listens."""

    kind: str
    """The name its consumer or external service gets ("ollama", "plex")."""
    runtime: str | None
    """Its `runtime:` in consumers.yaml; None for an external service."""
    programs: frozenset[str]
    subcommand: str | None = None
    """The first argument the program needs (`serve`)."""
    modules: frozenset[str] = frozenset()
    """Whole `python -m` modules that are this runtime whatever their last part."""
    check: Callable[[Process, Program, Path], bool] | None = None
    host_options: tuple[str, ...] = ()
    port_options: tuple[str, ...] = ()
    listen_flag: str | None = None
    """The address an address option without a value means (ComfyUI's bare `--listen`)."""
    address_env: str | None = None
    """A variable holding HOST:PORT (OLLAMA_HOST)."""
    host_env: str | None = None
    port_env: str | None = None
    default_host: str = "127.0.0.1"
    default_port: int | None = None
    model_options: tuple[str, ...] = ()
    commands: tuple[str, ...] = ()
    """An external service's process match strings."""
    how: str = ""
    """How it is recognised, in words (docs/install.md's table)."""

    @property
    def external(self) -> bool:
        return self.runtime is None

    def matches(self, process: Process, scan_root: Path = Path("/proc")) -> Program | None:
        program = program_of(process.argv)
        if program is None:
            return None
        if program.name not in self.programs and program.module not in self.modules:
            return None
        if self.subcommand is not None and program.module not in self.modules:
            args = program.args(process.argv)
            if not args or args[0] != self.subcommand:
                return None
        if self.check is not None and not self.check(process, program, scan_root):
            return None
        return program


RULES: tuple[Rule, ...] = (
    Rule(
        kind="ollama",
        runtime="ollama",
        programs=frozenset({"ollama"}),
        subcommand="serve",
        address_env="OLLAMA_HOST",
        default_port=11434,
        how="`ollama serve`; its address from OLLAMA_HOST in its environment",
    ),
    Rule(
        kind="comfyui",
        runtime="comfyui",
        programs=frozenset({"main.py"}),
        check=_comfyui_dir,
        host_options=("--listen",),
        port_options=("--port",),
        listen_flag="0.0.0.0",
        default_port=8188,
        how="`python main.py` in a folder named like ComfyUI (or holding `comfy/` and "
        "`folder_paths.py`); `--listen`, `--port`",
    ),
    Rule(
        kind="whisper",
        runtime="whisper",
        programs=frozenset({"whisper-server"}),
        host_options=("--host",),
        port_options=("--port",),
        default_port=8080,
        model_options=("-m", "--model"),
        how="the `whisper-server` binary; `--host`, `--port`, `-m`",
    ),
    Rule(
        kind="llama",
        runtime="llama-server",
        programs=frozenset({"llama-server"}),
        host_options=("--host",),
        port_options=("--port",),
        host_env="LLAMA_ARG_HOST",
        port_env="LLAMA_ARG_PORT",
        default_port=8080,
        model_options=("-m", "--model"),
        how="the `llama-server` binary; `--host`, `--port` (or LLAMA_ARG_HOST, "
        "LLAMA_ARG_PORT), `-m` (one model) or `--models-dir`/`--models-preset` (a router)",
    ),
    Rule(
        kind="vllm",
        runtime="vllm",
        programs=frozenset({"vllm"}),
        subcommand="serve",
        modules=frozenset({"vllm.entrypoints.openai.api_server"}),
        host_options=("--host",),
        port_options=("--port",),
        default_host="0.0.0.0",
        default_port=8000,
        model_options=("--model",),
        how="`vllm serve MODEL` or `python -m vllm.entrypoints.openai.api_server`; "
        "`--host`, `--port`, `--gpu-memory-utilization`, `--enable-sleep-mode`",
    ),
    Rule(
        kind="plex",
        runtime=None,
        programs=frozenset({"Plex Media Server", "Plex Transcoder"}),
        commands=("Plex Media Server", "Plex Transcoder"),
        how="`Plex Media Server` and its `Plex Transcoder` children",
    ),
    Rule(
        kind="tdarr",
        runtime=None,
        programs=frozenset({"Tdarr_Node", "Tdarr_Server"}),
        commands=("Tdarr_Node", "Tdarr_Server"),
        how="`Tdarr_Node`, `Tdarr_Server` and their `ffmpeg` children",
    ),
)


def rule_for(
    process: Process, rules: Sequence[Rule] = RULES, scan_root: Path = Path("/proc")
) -> tuple[Rule, Program] | None:
    """The first rule that recognises `process`, with the program it found."""
    for rule in rules:
        program = rule.matches(process, scan_root)
        if program is not None:
            return rule, program
    return None
