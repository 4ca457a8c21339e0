"""Which processes of a scanned host are which runtime: a table of small rules.

A rule names the program (the basename of the executable, of the script an interpreter
runs, or the last part of a `python -m` module), the subcommand it needs (`ollama serve`,
`vllm serve`), where the program reads its address (options, an environment variable, a
default) and its model. A process is a runtime's when its own command line matches a rule;
its children (Ollama's runners, vLLM's engine, a Plex transcode) are that runtime's too:
every process belongs to its outermost recognised ancestor. A process on the card that
nothing claims is `Unknown`. The rules are rules.py's, read off command lines
(cmdline.py).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import attrs

from gpugate.init.cmdline import Program, option
from gpugate.init.proc import Listener, Process
from gpugate.init.rules import RULES, Rule, rule_for
from gpugate.init.scan import GpuProcess, HostScan


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
