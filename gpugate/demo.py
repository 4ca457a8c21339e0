"""`gpugate demo` (what `make run` starts): the incident host, simulated, with the gate in front.

The simulated card is the one from the incident of 2026-07-10: gemma3:12b pinned for 24 h
and bge-m3 loaded straight at Ollama, whisper-server, mVoice and an idle ComfyUI. The gate
listens where Ollama's and ComfyUI's clients expect it (127.0.0.1:11434, 127.0.0.1:8188);
the simulated runtimes sit behind it on 127.0.0.1:11435 and 127.0.0.1:8189.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import threading
import wave
from pathlib import Path

import yaml

from gpugate.local_token import remove_local_token, write_local_token
from gpugate.sim.host import HostStartError
from gpugate.sim.hostprocess import SimulatedHostProcess

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_HOST = ROOT / "sim" / "incident-2026-07-10.yaml"
DEFAULT_CONFIG = ROOT / "sim" / "demo-consumers.yaml"

HOW_TO = """\
gpugate demo: a simulated 16 GiB GPU (the incident of 2026-07-10) with the gate in front.

  Ollama, through the gate:  http://127.0.0.1:11434
  the simulated Ollama:      http://127.0.0.1:11435  (what the gate forwards to)
  ComfyUI, through the gate: http://127.0.0.1:8188   (the simulated one on :8189)
  control:                   http://127.0.0.1:9411/gate/v1/status  and  /metrics

gemma3:12b and bge-m3 were loaded behind the gate's back with keep_alive 24h; 2.5 GiB is
schedulable. Ask for a model that does not fit and watch the gate evict the idle one:

  curl -s 127.0.0.1:11434/api/generate -d '{{"model": "qwen2.5:7b", "prompt": "hi"}}'
  OLLAMA_HOST=127.0.0.1:11434 .venv/bin/python -c \
      "import ollama; print(ollama.generate('llama3.2:3b', 'hi', keep_alive='24h').response)"
  curl -s 127.0.0.1:11434/api/ps
  .venv/bin/gpugate evict ollama bge-m3    # operator commands present the demo's token

Or render FLUX in ComfyUI (open http://127.0.0.1:8188, or queue it from a script): it
fails with CUDA out of memory at :8189 and renders through the gate, which evicts the
idle Ollama models for it first:

  curl -s 127.0.0.1:8188/prompt -d @sim/flux-prompt.json
  curl -s 127.0.0.1:8188/history   # once it is done: status_str "success"
  .venv/bin/gpugate status --config {config}

whisper-server, through the gate (the gate runs the simulated one and starts it again
when a request finds it stopped):

  curl -s 127.0.0.1:8080/inference -F file=@{wav} -F response_format=json

Events follow, one JSON line each. Ctrl-C stops the gate and the simulated host.
"""


def run_demo(host_file: Path | None = None, config_path: Path | None = None) -> int:
    """Start the simulated host and `gpugate serve`; stop both on Ctrl-C."""
    host_file = host_file or DEFAULT_HOST
    config_path = config_path or DEFAULT_CONFIG
    stop = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stop.set())
    print(f"starting the simulated host from {host_file} ...", flush=True)
    scratch = Path(tempfile.mkdtemp(prefix="gpugate-demo-"))
    wav = write_wav(scratch / "hello.wav")
    try:
        host = SimulatedHostProcess(without_whisper(host_file, scratch)).start()
    except HostStartError as exc:
        print(f"gpugate demo: {exc}", file=sys.stderr)
        return 1
    token: Path | None = None
    try:
        token = write_local_token()
        served = with_token(config_path, scratch, token)
        assert host.environment is not None
        env = host.environment.apply()
        # `python3` in the whisper consumer's command is this interpreter.
        env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
        gate = subprocess.Popen(
            [sys.executable, "-m", "gpugate", "serve", "--config", str(served)],
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
        print(HOW_TO.format(config=config_path, wav=wav), flush=True)
        threading.Thread(target=lambda: gate.wait() and stop.set(), daemon=True).start()
        stop.wait()
        gate.send_signal(signal.SIGTERM)
        code = gate.wait(timeout=60)
        return 0 if code in (0, -signal.SIGTERM) else code
    finally:
        host.stop()
        if token is not None:
            remove_local_token(token)


def with_token(config_path: Path, scratch: Path, token: Path) -> Path:
    """A copy of the demo's configuration whose control token is the local one, so the
    operator commands (which present it to a gate on loopback) work against the demo."""
    text = config_path.read_text()
    line = f'  control_tokens: ["file:{token}"]\n'
    copy = scratch / config_path.name
    copy.write_text(text.replace("gate:\n", "gate:\n" + line, 1))
    return copy


def without_whisper(host_file: Path, scratch: Path) -> Path:
    """The host file without its whisper-server: the gate runs that one (its `control`)."""
    host = yaml.safe_load(host_file.read_text())
    if host.pop("whisper", None) is None:
        return host_file
    copy = scratch / host_file.name
    copy.write_text(yaml.safe_dump(host))
    return copy


def write_wav(path: Path, seconds: float = 2.0) -> Path:
    """A short silent 16 kHz mono WAV to transcribe."""
    with wave.open(str(path), "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(16000)
        out.writeframes(b"\0\0" * int(16000 * seconds))
    return path
