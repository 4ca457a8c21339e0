"""`gpugate demo` (what `make run` starts): the incident host, simulated, with the gate in front.

The simulated card is the one from the incident of 2026-07-10: gemma3:12b pinned for 24 h
and bge-m3 loaded straight at Ollama, whisper-server, mVoice and an idle ComfyUI. The gate
listens where Ollama's and ComfyUI's clients expect it (127.0.0.1:11434, 127.0.0.1:8188);
the simulated runtimes sit behind it on 127.0.0.1:11435 and 127.0.0.1:8189.

Its files (the incident host, the gate's configuration, a FLUX prompt) are package data
(gpugate_sim/data/), so an installed gpugate runs it as a checkout does. It writes what it
generates (the configuration it serves, a WAV to transcribe, the prompt) into one temporary
directory, prints absolute paths and full URLs, and removes that directory when it stops.
It prints the `export GPUGATE_CONFIG=...` that lets every command find the configuration it
serves without `--config`, from any directory.
Its gate's control token is the local token of its control port (local_token.py), held
while the demo runs and removed when it stops: a second demo (another user's, or one moved
with `--port-base`) has its own, and the commands each prints present that demo's.

`--port-base N` moves every port, in the order of PORTS: N is the gate's Ollama listener,
N+1 the simulated Ollama behind it, and so on up to N+8, the control listener. Without it
the demo takes the ports its clients expect. `--two-cards` runs the same home server after
it got a second card (two-cards.yaml): Ollama on both cards, models split over them.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import wave
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from gpugate.commands.exits import Exit
from gpugate.commands.local_token import (
    LocalToken,
    TokenInUse,
    remove_local_token,
    write_local_token,
)

# PyYAML, the configuration's model and the simulator are imported where they are used:
# every `gpugate` command imports this module to build its parser.


def _simulator_data() -> Path:
    # Where gpugate_sim lies, found without importing it: building the parser must not.
    spec = importlib.util.find_spec("gpugate_sim")
    assert spec is not None and spec.submodule_search_locations, "gpugate_sim is not installed"
    return Path(next(iter(spec.submodule_search_locations))) / "data"


DATA = _simulator_data()
"""The demo's files, shipped with the simulator: the incident host, its gate, a FLUX prompt."""
DEFAULT_HOST = DATA / "incident-2026-07-10.yaml"
DEFAULT_CONFIG = DATA / "demo-consumers.yaml"
TWO_CARDS_HOST = DATA / "two-cards.yaml"
TWO_CARDS_CONFIG = DATA / "two-cards-consumers.yaml"
FLUX_PROMPT = DATA / "flux-prompt.json"

PORTS: tuple[tuple[str, int], ...] = (
    ("ollama", 11434),
    ("ollama_upstream", 11435),
    ("comfyui", 8188),
    ("comfyui_upstream", 8189),
    ("whisper", 8080),
    ("whisper_upstream", 8081),
    ("mvoice", 7860),
    ("mvoice_upstream", 7861),
    ("control", 9411),
)
"""Every port of the demo with its default, in the order `--port-base N` numbers them."""

HOW_TO = """\
gpugate demo: a simulated 16 GiB GPU (the incident of 2026-07-10) with the gate in front.

  Ollama, through the gate:  http://127.0.0.1:{ollama}
  the simulated Ollama:      http://127.0.0.1:{ollama_upstream}  (what the gate forwards to)
  ComfyUI, through the gate: http://127.0.0.1:{comfyui}  (the simulated one on :{comfyui_upstream})
  whisper, through the gate: http://127.0.0.1:{whisper}  (the simulated one on :{whisper_upstream})
  control:                   http://127.0.0.1:{control}/gate/v1/status  and  /metrics
  the demo's files:          {scratch}  (removed when it stops)

gemma3:12b and bge-m3 were loaded behind the gate's back with keep_alive 24h; 2.5 GiB is
schedulable. See the budget and evict one by hand (the operator commands present the token
that the demo's configuration names to its control port):

  {gpugate} status --config {config}
  {gpugate} evict ollama bge-m3 --config {config}

Every gpugate command (the README's, as printed) finds this configuration without --config
in a shell where

  export GPUGATE_CONFIG={config}

Ask for a model that does not fit and watch the gate evict the idle one:

  curl -s http://127.0.0.1:{ollama}/api/generate -d '{{"model": "qwen2.5:7b", "prompt": "hi"}}'
{ollama_client}\
  curl -s http://127.0.0.1:{ollama}/api/ps

Or render FLUX in ComfyUI (open http://127.0.0.1:{comfyui}, or queue it from a script).
Its 17.2 GiB never fit the card: straight at :{comfyui_upstream} ComfyUI loads what fits
beside the pinned models and streams the rest of its UNet from CPU RAM; through the gate the
idle Ollama models it may evict go first, and the answer's X-GPUGate-Degraded says what it
was granted of what it asked:

  curl -s http://127.0.0.1:{comfyui}/prompt -d @{prompt}
  curl -s http://127.0.0.1:{comfyui}/history   # once it is done: status_str "success"

whisper-server, through the gate (the gate runs the simulated one and starts it again
when a request finds it stopped):

  curl -s http://127.0.0.1:{whisper}/inference -F file=@{wav} -F response_format=json

Events follow, one JSON line each. Ctrl-C stops the gate and the simulated host.
"""

HOW_TO_TWO_CARDS = """\
gpugate demo --two-cards: two simulated GPUs, an RTX 4090 (24 GiB) and an RTX 4080 (16 GiB),
with the gate in front.

  Ollama, through the gate:  http://127.0.0.1:{ollama}  (it may load on either card)
  the simulated Ollama:      http://127.0.0.1:{ollama_upstream}  (what the gate forwards to)
  ComfyUI, through the gate: http://127.0.0.1:{comfyui}  (on the 4090; behind: :{comfyui_upstream})
  whisper, through the gate: http://127.0.0.1:{whisper}  (the gate starts it on the card it chooses)
  control:                   http://127.0.0.1:{control}/gate/v1/status  and  /metrics
  the demo's files:          {scratch}  (removed when it stops)

gemma3:12b and bge-m3 were loaded on the 4090 behind the gate's back; Plex transcodes on the
4080. Both cards' budgets, each model on its card:

  {gpugate} status --config {config}

Every gpugate command finds this configuration without --config in a shell where

  export GPUGATE_CONFIG={config}

Ask for a model that fits neither card within Ollama's 80 %: Ollama splits it over both,
and the gate leases the part on each card before it is loaded (status shows both parts):

  curl -s http://127.0.0.1:{ollama}/api/generate -d '{{"model": "qwen2.5:32b", "prompt": "hi"}}'
{ollama_client}\
  curl -s http://127.0.0.1:{ollama}/api/ps

Render FLUX on the 4090: the gate evicts what stands in its way on that card only:

  curl -s http://127.0.0.1:{comfyui}/prompt -d @{prompt}
  curl -s http://127.0.0.1:{whisper}/inference -F file=@{wav} -F response_format=json

Events follow, one JSON line each. Ctrl-C stops the gate and the simulated host.
"""

OLLAMA_CLIENT = """\
  OLLAMA_HOST=127.0.0.1:{ollama} {python} -c \\
      "import ollama; print(ollama.generate('llama3.2:3b', 'hi', keep_alive='24h').response)"
"""


def demo_ports(port_base: int | None = None) -> dict[str, int]:
    """The demo's ports by name: the defaults, or N, N+1, ... in the order of PORTS."""
    if port_base is None:
        return dict(PORTS)
    if not 1024 <= port_base <= 65535 - (len(PORTS) - 1):
        raise ValueError(f"--port-base must be between 1024 and {65535 - (len(PORTS) - 1)}")
    return {name: port_base + offset for offset, (name, _) in enumerate(PORTS)}


def add_parser(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """The `demo` subcommand's options."""
    demo = subparsers.add_parser("demo", help="a simulated host with the gate in front of it")
    demo.add_argument(
        "--host-file", type=Path, help="default: the incident card of 2026-07-10 (packaged)"
    )
    demo.add_argument("--config", type=Path, help="default: the demo's consumers.yaml (packaged)")
    demo.add_argument(
        "--two-cards",
        action="store_true",
        help="a host with two cards (24 GiB + 16 GiB): Ollama on both, models split over them",
    )
    demo.add_argument(
        "--port-base",
        type=int,
        metavar="N",
        help="move every port of the demo to N..N+8, in this order: Ollama through the gate, "
        "the simulated Ollama, ComfyUI through the gate, the simulated ComfyUI, whisper-server "
        "through the gate, the simulated one, mVoice through the gate, its upstream, the "
        "control listener (default: 11434 11435 8188 8189 8080 8081 7860 7861 9411)",
    )


def run(args: argparse.Namespace) -> int:
    """`gpugate demo` with its options."""
    return run_demo(
        host_file=args.host_file,
        config_path=args.config,
        port_base=args.port_base,
        two_cards=args.two_cards,
    )


def run_demo(
    host_file: Path | None = None,
    config_path: Path | None = None,
    port_base: int | None = None,
    *,
    two_cards: bool = False,
) -> int:
    """Start the simulated host and `gpugate serve`; stop both on Ctrl-C. `two_cards`: the
    host with a second card (two-cards.yaml) rather than the incident's one card."""
    # The simulator is imported here only: no other command, and nothing the gate runs, needs it.
    from gpugate_sim.host import HostStartError
    from gpugate_sim.hostprocess import SimulatedHostProcess

    host_file = (host_file or (TWO_CARDS_HOST if two_cards else DEFAULT_HOST)).resolve()
    config_path = (config_path or (TWO_CARDS_CONFIG if two_cards else DEFAULT_CONFIG)).resolve()
    try:
        ports = demo_ports(port_base)
    except ValueError as exc:
        print(f"gpugate demo: {exc}", file=sys.stderr)
        return Exit.USAGE
    busy = ports_in_use(ports)
    if busy:
        taken = ", ".join(f"127.0.0.1:{port} ({name})" for name, port in busy.items())
        hint = (
            "choose another --port-base"
            if port_base is not None
            else "--port-base N (e.g. --port-base 40000) moves every port of the demo"
        )
        print(f"gpugate demo: already in use: {taken}; {hint}", file=sys.stderr)
        return 1
    stop = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stop.set())
    print(f"starting the simulated host from {host_file} ...", flush=True)
    scratch = Path(tempfile.mkdtemp(prefix="gpugate-demo-"))
    token: LocalToken | None = None
    host: SimulatedHostProcess | None = None
    gate: subprocess.Popen[str] | None = None
    try:
        try:
            # The token of this demo's gate alone: another demo (on other ports) has its own.
            token = write_local_token(control_port(config_path, ports))
        except TokenInUse as exc:
            print(f"gpugate demo: {exc}; choose another --port-base", file=sys.stderr)
            return 1
        files = prepare(scratch, host_file, config_path, ports, token.path)
        try:
            host = SimulatedHostProcess(files["host"]).start()
        except HostStartError as exc:
            print(f"gpugate demo: {exc}", file=sys.stderr)
            return 1
        assert host.environment is not None
        env = host.environment.apply()
        # `python3` in the whisper consumer's command is this interpreter.
        env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
        gate = subprocess.Popen(
            [sys.executable, "-m", "gpugate", "serve", "--config", str(files["config"])],
            env=env,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert gate.stdout is not None
        for line in gate.stdout:
            print(line.rstrip(), flush=True)
            if line.startswith("gpugate: ready"):
                break
        else:
            print("gpugate demo: the gate did not start (see above)", file=sys.stderr)
            return 1
        print(how_to(ports, scratch, files, two_cards=two_cards), flush=True)
        running = gate
        threading.Thread(target=lambda: (running.wait(), stop.set()), daemon=True).start()
        stop.wait()
        gate.send_signal(signal.SIGTERM)
        code = gate.wait(timeout=60)
        return 0 if code in (0, -signal.SIGTERM) else code
    finally:
        if gate is not None and gate.poll() is None:
            gate.terminate()
            try:
                gate.wait(timeout=30)
            except subprocess.TimeoutExpired:
                gate.kill()
                gate.wait()
        if host is not None:
            host.stop()
        if token is not None:
            remove_local_token(token)
        shutil.rmtree(scratch, ignore_errors=True)


def control_port(config_path: Path, ports: Mapping[str, int]) -> int:
    """The port of the control listener the demo's configuration gives its gate, on the
    demo's ports: its local token is named by it (local_token.py)."""
    import yaml

    from gpugate.config.model import Address, GateSettings

    moves = {default: ports[name] for name, default in PORTS}
    config = move_ports(yaml.safe_load(config_path.read_text()) or {}, moves)
    control = (config.get("gate") or {}).get("control")
    return GateSettings().control.port if control is None else Address.parse(control).port


def prepare(
    scratch: Path, host_file: Path, config_path: Path, ports: Mapping[str, int], token: Path
) -> dict[str, Path]:
    """The demo's files in `scratch`, on `ports`: the host, the configuration, a WAV, the
    FLUX prompt. Nothing is started."""
    moves = {default: ports[name] for name, default in PORTS}
    prompt = scratch / FLUX_PROMPT.name
    shutil.copyfile(FLUX_PROMPT, prompt)
    return {
        "host": host_copy(host_file, scratch, moves),
        "config": config_copy(config_path, scratch, token, moves),
        "wav": write_wav(scratch / "hello.wav"),
        "prompt": prompt,
    }


def how_to(
    ports: Mapping[str, int], scratch: Path, files: Mapping[str, Path], *, two_cards: bool = False
) -> str:
    """What to try, with the demo's ports and absolute paths: it works from any directory."""
    python = shlex.quote(sys.executable)
    script = Path(sys.executable).parent / "gpugate"
    gpugate = shlex.quote(str(script)) if script.is_file() else f"{python} -m gpugate"
    client = (
        OLLAMA_CLIENT.format(ollama=ports["ollama"], python=python)
        if importlib.util.find_spec("ollama") is not None
        else ""
    )
    return (HOW_TO_TWO_CARDS if two_cards else HOW_TO).format(
        **ports,
        scratch=scratch,
        ollama_client=client,
        gpugate=gpugate,
        config=shlex.quote(str(files["config"])),
        prompt=shlex.quote(str(files["prompt"])),
        wav=shlex.quote(str(files["wav"])),
    )


def ports_in_use(ports: Mapping[str, int]) -> dict[str, int]:
    """The ports something on 127.0.0.1 already listens on (their names)."""
    busy = {}
    for name, port in ports.items():
        with socket.socket() as probe:
            probe.settimeout(0.5)
            if probe.connect_ex(("127.0.0.1", port)) == 0:
                busy[name] = port
    return busy


def config_copy(config_path: Path, scratch: Path, token: Path, moves: Mapping[int, int]) -> Path:
    """The demo's configuration on the demo's ports, whose control token is the local one, so
    the operator commands (which present it to a gate on loopback) work against the demo."""
    import yaml

    config = move_ports(yaml.safe_load(config_path.read_text()), moves)
    config.setdefault("gate", {})["control_tokens"] = [f"file:{token}"]
    copy = scratch / "consumers.yaml"
    header = f"# gpugate demo's configuration, from {config_path}\n"
    copy.write_text(header + yaml.safe_dump(config, sort_keys=False))
    return copy


def host_copy(host_file: Path, scratch: Path, moves: Mapping[int, int]) -> Path:
    """The host file on the demo's ports, without its whisper-server: the gate runs that one
    (its `control`)."""
    import yaml

    host = move_ports(yaml.safe_load(host_file.read_text()), moves)
    host.pop("whisper", None)
    copy = scratch / "host.yaml"
    copy.write_text(f"# gpugate demo's host, from {host_file}\n" + yaml.safe_dump(host))
    return copy


_ADDRESS = re.compile(
    r"^(?P<head>(?:[a-z][a-z0-9+.-]*://)?(?:\[[^\]]*\]|[^/\s:\[\]]*):)(?P<port>\d+)(?P<tail>/\S*)?$"
)


def move_ports(node: Any, moves: Mapping[int, int]) -> Any:
    """`node` with every HOST:PORT, URL and `--port P` argument on a port in `moves` moved."""
    if isinstance(node, dict):
        return {key: move_ports(value, moves) for key, value in node.items()}
    if isinstance(node, list):
        moved = [move_ports(item, moves) for item in node]
        for i in range(1, len(moved)):
            if moved[i - 1] == "--port" and str(moved[i]).isdigit() and int(moved[i]) in moves:
                port = moves[int(moved[i])]
                moved[i] = str(port) if isinstance(moved[i], str) else port
        return moved
    if isinstance(node, str) and (match := _ADDRESS.match(node)) and int(match["port"]) in moves:
        return f"{match['head']}{moves[int(match['port'])]}{match['tail'] or ''}"
    return node


def write_wav(path: Path, seconds: float = 2.0) -> Path:
    """A short silent 16 kHz mono WAV to transcribe."""
    with wave.open(str(path), "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(16000)
        out.writeframes(b"\0\0" * int(16000 * seconds))
    return path
