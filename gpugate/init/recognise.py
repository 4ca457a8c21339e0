"""Which processes of a scanned host are which runtime: a table of small rules.

A rule names the program (the basename of the executable, of the script an interpreter
runs, or the last part of a `python -m` module), the subcommand it needs (`ollama serve`,
`vllm serve`), where the program reads its address (options, an environment variable, a
default) and its model. A process is a runtime's when its own command line matches a rule;
its children (Ollama's runners, vLLM's engine, a Plex transcode) are that runtime's too:
every process belongs to its outermost recognised ancestor. A process on the card that
nothing claims is `Unknown`.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import attrs

from gpugate.init.scan import GpuProcess, HostScan, Listener, Process

_INTERPRETER = re.compile(r"^(python[0-9.]*|pypy[0-9.]*|node(js)?|bun)$")
_INTERPRETER_OPTIONS_WITH_VALUE = frozenset({"-X", "-W", "--check-hash-based-pycs"})


@attrs.frozen
class Program:
    """What a command line runs: `ollama`, `main.py`, `whisper-server`, a module's last part."""

    name: str
    word: str
    """The word as the command line writes it (a path, a module name)."""
    index: int
    """Its position in argv: the program's own arguments follow it."""
    module: str | None = None
    """The module of `python -m MODULE`."""

    def args(self, argv: Sequence[str]) -> tuple[str, ...]:
        return tuple(argv[self.index + 1 :])


def program_of(argv: Sequence[str]) -> Program | None:
    """The program a command line runs, looking through an interpreter (`python3 -m x.y`,
    `python3 /opt/ComfyUI/main.py`, `node server.js`)."""
    if not argv or not argv[0]:
        return None
    first = os.path.basename(argv[0])
    if not _INTERPRETER.match(first):
        return Program(first, argv[0], 0)
    i = 1
    while i < len(argv) and argv[i].startswith("-") and argv[i] != "-":
        word = argv[i]
        if word == "-m" and i + 1 < len(argv):
            module = argv[i + 1]
            return Program(module.rpartition(".")[2], module, i + 1, module)
        if word == "-c":
            return None
        i += 2 if word in _INTERPRETER_OPTIONS_WITH_VALUE else 1
    if i < len(argv):
        return Program(os.path.basename(argv[i]), argv[i], i)
    return None


def option(
    args: Sequence[str], names: Sequence[str], *, flag_value: str | None = None
) -> str | None:
    """The value of the last of `names` in `args` (`--port 8188`, `--port=8188`).

    `flag_value`: what an option given without a value means (ComfyUI's bare `--listen`).
    """
    found: str | None = None
    for i, word in enumerate(args):
        for name in names:
            if word == name:
                following = args[i + 1] if i + 1 < len(args) else None
                if following is not None and not following.startswith("-"):
                    found = following
                elif flag_value is not None:
                    found = flag_value
            elif word.startswith(name + "=") and name.startswith("--"):
                found = word.split("=", 1)[1]
    return found


def has_flag(args: Sequence[str], names: Sequence[str]) -> bool:
    return any(word in names or word.split("=", 1)[0] in names for word in args)


# -- the rules ---------------------------------------------------------------------------


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


# -- what is found -----------------------------------------------------------------------


@attrs.frozen
class Address:
    """Where a runtime listens (or would), and how init knows."""

    host: str
    port: int
    source: str
    """"its listening socket", "OLLAMA_HOST in its environment", "--port", "the default"."""


@attrs.frozen
class Found:
    """A runtime or external service, with its whole process tree."""

    rule: Rule
    process: Process
    program: Program
    members: tuple[int, ...]
    """Its PIDs: itself and every descendant seen."""
    gpu_use: tuple[GpuProcess, ...] = ()
    """Its processes on the card now."""
    listeners: tuple[Listener, ...] = ()
    """The sockets it listens on itself."""
    address: Address | None = None

    @property
    def kind(self) -> str:
        return self.rule.kind

    @property
    def args(self) -> tuple[str, ...]:
        return self.program.args(self.process.argv)

    @property
    def bytes_now(self) -> int:
        return sum(p.used or 0 for p in self.gpu_use)

    def bytes_on(self, gpu: int) -> int:
        return sum(p.used or 0 for p in self.gpu_use if p.gpu == gpu)

    @property
    def gpus(self) -> list[int]:
        """The cards it holds memory on, the one with most bytes first."""
        cards = {p.gpu for p in self.gpu_use}
        return sorted(cards, key=lambda g: (-self.bytes_on(g), g))

    def opt(self, names: Sequence[str]) -> str | None:
        return option(self.args, names)

    @property
    def env(self) -> Mapping[str, str]:
        return self.process.env or {}

    @property
    def model(self) -> str | None:
        if self.rule.kind == "vllm" and self.program.module is None:
            positional = self.args[1] if len(self.args) > 1 else None
            if positional is not None and not positional.startswith("-"):
                return positional
        return self.opt(self.rule.model_options) if self.rule.model_options else None


@attrs.frozen
class Unknown:
    """A process on the card that no rule claims (it stays external `other`)."""

    pid: int
    gpu: int
    used: int | None
    command: str


@attrs.frozen
class Recognised:
    """Everything recognised on a host."""

    runtimes: tuple[Found, ...]
    external: tuple[Found, ...]
    unknown: tuple[Unknown, ...]


def parse_ollama_host(value: str) -> tuple[str, int]:
    """Where `ollama serve` listens for OLLAMA_HOST=`value`, as Ollama's envconfig.Host
    reads it: an optional scheme, a host, an optional port (11434; 80 or 443 after an
    explicit http:// or https://)."""
    default_port = 11434
    value = value.strip()
    scheme, sep, hostport = value.partition("://")
    if not sep:
        hostport = value
    elif scheme == "http":
        default_port = 80
    elif scheme == "https":
        default_port = 443
    hostport = hostport.partition("/")[0]
    host, port = _split_host_port(hostport)
    if port is None:
        host = hostport.strip("[]") or "127.0.0.1"
        return host, default_port
    if not port.isdigit() or int(port) > 65535:
        return (host or "0.0.0.0"), default_port
    return (host or "0.0.0.0"), int(port)


def _split_host_port(text: str) -> tuple[str, str | None]:
    """Go's net.SplitHostPort, loosely: ("host", "port"), or (text, None) without a port."""
    if text.startswith("["):
        end = text.find("]")
        if end < 0 or not text[end + 1 :].startswith(":"):
            return text, None
        return text[1:end], text[end + 2 :]
    if text.count(":") != 1:
        return text, None
    host, _, port = text.partition(":")
    return host, port


def widest(listeners: Sequence[Listener]) -> Listener:
    """The socket that reaches the most clients: every address, else one off this host,
    else loopback (IPv4 before IPv6 among equals). The gate takes its address, so that no
    client that reaches the runtime now is cut off."""
    return sorted(
        listeners, key=lambda li: (not li.is_any, li.is_loopback, ":" in li.host, li.host)
    )[0]


def _address(
    rule: Rule,
    process: Process,
    program: Program,
    listeners: Sequence[Listener],
    unowned: Sequence[Listener] = (),
) -> Address | None:
    """Where the runtime listens: its socket when /proc shows one, else what it was told.

    `unowned`: this namespace's listening sockets, when the process's own cannot be read
    (another user's, without root): one on the port it was told is taken as its own, so that
    a runtime on every address is not taken for one on loopback."""
    if rule.external:
        return None
    args = program.args(process.argv)
    env = process.env or {}
    host: str | None = None
    port: int | None = None
    source = "the default"
    if rule.address_env and env.get(rule.address_env):
        host, port = parse_ollama_host(env[rule.address_env])
        source = f"{rule.address_env} in its environment"
    if rule.host_env and env.get(rule.host_env):
        host, source = env[rule.host_env], f"{rule.host_env} in its environment"
    if rule.port_env and env.get(rule.port_env, "").isdigit():
        port, source = int(env[rule.port_env]), f"{rule.port_env} in its environment"
    given_host = (
        option(args, rule.host_options, flag_value=rule.listen_flag) if rule.host_options else None
    )
    given_port = option(args, rule.port_options) if rule.port_options else None
    if given_host is not None:
        host, source = given_host.split(",")[0], f"{rule.host_options[0]} on its command line"
    if given_port is not None and given_port.isdigit():
        port, source = int(given_port), f"{rule.port_options[0]} on its command line"
    host = host or rule.default_host
    port = port or rule.default_port
    if listeners:
        wanted = [li for li in listeners if li.port == port] or list(listeners)
        chosen = widest(wanted)
        return Address(chosen.host, chosen.port, "its listening socket")
    if port is None:
        return None
    on_port = [li for li in unowned if li.port == port]
    if on_port:
        chosen = widest(on_port)
        return Address(
            chosen.host, chosen.port, "a socket on its port (whose, init could not read)"
        )
    return Address(host, port, source)


def recognise(scan: HostScan, rules: Sequence[Rule] = RULES) -> Recognised:
    """Apply the rules to every process of the scan; group each tree under its outermost
    recognised process."""
    matched: dict[int, tuple[Rule, Program]] = {}
    for pid, process in scan.processes.items():
        hit = rule_for(process, rules, scan.proc_root)
        if hit is not None:
            matched[pid] = hit

    def owner(pid: int) -> int | None:
        found = None
        for ancestor in scan.ancestry(pid):
            if ancestor.pid in matched:
                found = ancestor.pid
        return found

    trees: dict[int, list[int]] = {}
    for pid in scan.processes:
        root = owner(pid)
        if root is not None:
            trees.setdefault(root, []).append(pid)
    on_card: dict[int, list[GpuProcess]] = {}
    unknown: list[Unknown] = []
    for gpu_process in scan.gpu_processes:
        root = owner(gpu_process.pid)
        if root is None:
            process = scan.processes.get(gpu_process.pid)
            command = process.command if process is not None else "(not in /proc here)"
            unknown.append(Unknown(gpu_process.pid, gpu_process.gpu, gpu_process.used, command))
        else:
            on_card.setdefault(root, []).append(gpu_process)
    runtimes: list[Found] = []
    external: list[Found] = []
    for root, members in sorted(trees.items()):
        rule, program = matched[root]
        process = scan.processes[root]
        listeners = tuple(scan.listeners_of(root))
        # Another user's sockets are unreadable without root; this namespace's table is
        # only this namespace's processes'.
        unowned = scan.listeners if not process.fds_readable and process.namespaces.same_net else ()
        found = Found(
            rule=rule,
            process=process,
            program=program,
            members=tuple(sorted(members)),
            gpu_use=tuple(on_card.get(root, ())),
            listeners=listeners,
            address=_address(rule, process, program, listeners, unowned),
        )
        (external if rule.external else runtimes).append(found)
    return Recognised(tuple(runtimes), tuple(external), tuple(unknown))
