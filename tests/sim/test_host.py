"""`gpugate sim run` and its holder processes, as real processes read through the fake NVML."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from gpugate.core.units import GiB, MiB
from gpugate_sim.children import EXIT_OOM, Stopped
from gpugate_sim.device import HostState, SimDevice, SimulatedGpuHost
from gpugate_sim.holder import holder_argv, set_cmdline
from gpugate_sim.host import (
    HostEnvironment,
    HostStartError,
    SimulatedHost,
    default_gpu_uuid,
)
from gpugate_sim.hostprocess import SimulatedHostProcess
from gpugate_sim.ollama.blobs import write_blob
from gpugate_sim.ollama.sizing import runner_bytes
from gpugate_sim.scenario import GpuSpec, HolderSpec, HostSpec, OllamaSpec, load_host
from tests.ports import free_ports
from tests.sim.processes import (
    LineReader,
    cmdline,
    comm,
    kill_quietly,
    parent_pid,
    pid_exists,
    processes_with,
)

REPO = Path(__file__).resolve().parents[2]
INCIDENT = REPO / "gpugate_sim" / "data" / "incident-2026-07-10.yaml"
TOTAL = 16 * GiB
RESERVED = 434 * MiB
RUN_TIMEOUT = 30.0

NVML_PROBE = """
import json, pynvml
pynvml.nvmlInit()
device = pynvml.nvmlDeviceGetHandleByIndex(0)
memory = pynvml.nvmlDeviceGetMemoryInfo(device, version=pynvml.nvmlMemory_v2)
rows = []
for kind, listing in (("C", pynvml.nvmlDeviceGetComputeRunningProcesses),
                      ("G", pynvml.nvmlDeviceGetGraphicsRunningProcesses)):
    for p in listing(device):
        rows.append([kind, p.pid, p.usedGpuMemory, pynvml.nvmlSystemGetProcessName(p.pid)])
print(json.dumps({"name": pynvml.nvmlDeviceGetName(device), "free": memory.free,
                  "used": memory.used, "rows": rows}))
"""


@pytest.fixture
def tag() -> str:
    """A word unique to this test, put in every command line it starts, to find leftovers."""
    return f"t{uuid.uuid4().hex[:12]}"


def write_host(path: Path, holders: list[dict[str, object]]) -> Path:
    gpu = {"name": "NVIDIA GeForce RTX 4080", "total": "16GiB", "reserved": "434MiB"}
    path.write_text(yaml.safe_dump({"gpus": [gpu], "holders": holders}))
    return path


def family(tag: str) -> list[dict[str, object]]:
    """whisper-server, an Ollama-like parent with a runner child, and a desktop process."""
    return [
        {
            "name": "whisper-server",
            "command": ["whisper-server", "-m", "ggml-large-v3.bin", "--port", "8081", tag],
            "bytes": "2050MiB",
        },
        {
            "name": "ollama",
            "command": ["ollama", "serve", tag],
            "children": [
                {
                    "name": "llama-server",
                    "command": ["/usr/lib/ollama/llama-server", "--model", "blob", tag],
                    "bytes": "1GiB",
                }
            ],
        },
        {
            "name": "Xorg",
            "command": ["/usr/lib/xorg/Xorg", ":0", tag],
            "bytes": "200MiB",
            "kind": "G",
        },
    ]


@pytest.fixture
def sim_run() -> Iterator[list[subprocess.Popen[str]]]:
    """Starts `gpugate sim run` processes; any still running at teardown are killed."""
    started: list[subprocess.Popen[str]] = []
    yield started
    for proc in started:
        kill_quietly(proc)


def start_sim_run(
    started: list[subprocess.Popen[str]], host_file: Path, env: dict[str, str] | None = None
) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "gpugate", "sim", "run", str(host_file)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    started.append(proc)
    return proc


def probe(environment: HostEnvironment) -> dict[str, object]:
    """What a fresh process sees through NVML with the environment `sim run` printed."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUGATE_")}
    env.update(environment.variables())
    out = subprocess.run(
        [sys.executable, "-c", NVML_PROBE],
        env=env,
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT,
        check=True,
    )
    return json.loads(out.stdout)


# -- gpugate sim run ------------------------------------------------------------------------------


@pytest.mark.parametrize("stop_signal", [signal.SIGTERM, signal.SIGINT], ids=["TERM", "INT"])
def test_sim_run_serves_its_holders_and_stops_cleanly(
    tmp_path: Path, sim_run: list[subprocess.Popen[str]], tag: str, stop_signal: int
) -> None:
    host_file = write_host(tmp_path / "host.yaml", family(tag))
    proc = start_sim_run(sim_run, host_file)
    out = LineReader(proc.stdout)
    err = LineReader(proc.stderr)
    ready = out.until("# simulated host ready")
    assert ready == "# simulated host ready: 1 GPU(s), 4 holder(s)"
    environment = HostEnvironment.from_lines(out.seen)
    assert [line.split("=")[0] for line in out.seen[:3]] == [
        "GPUGATE_FAKE_NVML_STATE",
        "LD_LIBRARY_PATH",
        "GPUGATE_NVML_LIBRARY",
    ]
    assert environment.state_path.is_absolute() and environment.state_path.exists()
    assert environment.library_path.name == "libnvidia-ml.so.1"
    assert f"LD_LIBRARY_PATH={environment.library_path.parent}" in out.seen

    seen = probe(environment)
    rows = {(kind, name): (pid, used) for kind, pid, used, name in seen["rows"]}
    assert {key: used for key, (_, used) in rows.items()} == {
        ("C", "whisper-server"): 2050 * MiB,
        ("C", "llama-server"): GiB,
        ("G", "Xorg"): 200 * MiB,
    }
    assert seen["free"] == TOTAL - RESERVED - (2050 * MiB + GiB + 200 * MiB)

    whisper = rows["C", "whisper-server"][0]
    runner = rows["C", "llama-server"][0]
    xorg = rows["G", "Xorg"][0]
    assert (comm(whisper), cmdline(whisper)) == (
        "whisper-server",
        ["whisper-server", "-m", "ggml-large-v3.bin", "--port", "8081", tag],
    )
    assert comm(xorg) == "Xorg"
    # The runner is a child of its parent holder, which is a child of `sim run`.
    ollama = parent_pid(runner)
    assert (comm(ollama), cmdline(ollama)) == ("ollama", ["ollama", "serve", tag])
    assert parent_pid(ollama) == proc.pid
    assert parent_pid(whisper) == proc.pid
    started = [whisper, runner, ollama, xorg]
    assert sorted(processes_with(tag)) == sorted(started)

    # A holder that dies is reported, its memory comes back, and the host carries on.
    os.kill(xorg, signal.SIGKILL)
    assert err.next() == f"simulated host: holder Xorg (pid {xorg}) exited with signal SIGKILL"
    after = probe(environment)
    assert [row[3] for row in after["rows"]] == ["whisper-server", "llama-server"]
    assert after["free"] == seen["free"] + 200 * MiB

    proc.send_signal(stop_signal)
    assert proc.wait(timeout=RUN_TIMEOUT) == 0
    assert out.rest() == [], "nothing more on stdout after the ready line"
    assert err.rest() == [], "a clean run says nothing on stderr"
    assert [pid for pid in started if pid_exists(pid)] == []
    assert processes_with(tag) == []
    assert not environment.state_path.parent.exists(), "the temporary state dir is removed"


def test_sim_run_keeps_a_given_state_dir(tmp_path: Path, tag: str) -> None:
    host_file = write_host(tmp_path / "host.yaml", family(tag)[:1])
    state_dir = tmp_path / "state"
    with SimulatedHostProcess(host_file, state_dir) as host:
        assert host.environment is not None
        assert host.environment.state_path == state_dir / "nvml.state"
        assert host.ready_line == "# simulated host ready: 1 GPU(s), 1 holder(s)"
        (whisper,) = processes_with(tag)
        held = SimulatedGpuHost(state_dir).read().held_by(whisper, 0)
        assert held == 2050 * MiB
        assert host.stop() == 0
    assert processes_with(tag) == []
    assert SimulatedGpuHost(state_dir).read().processes == []


@pytest.mark.parametrize("where", ["top", "child"])
def test_a_holder_that_does_not_fit_fails_sim_run(
    tmp_path: Path, sim_run: list[subprocess.Popen[str]], tag: str, where: str
) -> None:
    hog = {"name": "hog", "command": ["hog", tag], "bytes": "20GiB"}
    first = {"name": "first", "command": ["first", tag], "bytes": "1GiB"}
    if where == "child":
        holders = [first, {"name": "parent", "command": ["parent", tag], "children": [hog]}]
        culprit = "'parent' (0 bytes on GPU 0)"
        assert_also = "holder parent: child holder hog exited with code 3 (out of GPU memory)"
    else:
        holders = [first, hog]
        culprit = "'hog' (21474836480 bytes on GPU 0)"
        assert_also = "OOM CUDA error"
    host_file = write_host(tmp_path / "host.yaml", holders)
    temp = tmp_path / "temp"
    temp.mkdir()
    proc = start_sim_run(sim_run, host_file, env={**os.environ, "TMPDIR": str(temp)})
    stdout, stderr = proc.communicate(timeout=RUN_TIMEOUT)
    assert proc.returncode == 1
    assert stdout == ""
    assert f"gpugate sim run: holder {culprit} did not start: exited with code 3" in stderr
    assert "out of GPU memory" in stderr
    assert assert_also in stderr
    assert "OOM CUDA error: out of memory (GPU 0: pid" in stderr
    assert "asked for 21474836480 bytes" in stderr
    assert processes_with(tag) == []
    assert list(temp.iterdir()) == [], "the temporary state dir is removed"


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        ({"holders": [{"name": "x", "bytes": "lots"}]}, "holders[0].bytes: expected a size"),
        ({"holders": [{"name": "x", "size": "1GiB"}]}, "holders[0]: unknown key(s) size"),
        ({"holders": [{"bytes": "1GiB"}]}, "holders[0].name: required"),
        ({"holders": [{"name": "x", "gpu": 1}]}, "holders[0].gpu: no GPU 1 (the host has 1)"),
        ({"gpus": [{"total": "-1GiB"}]}, "gpus[0].total:"),
        (
            {"holders": [{"name": "p", "children": [{"name": "c", "kind": "X"}]}]},
            "holders[0].children[0].kind: expected C, G or CG",
        ),
        (
            {"holders": [{"name": "plex", "pulse_period": "2s"}]},
            "holders[0]: pulse_period and pulse_bytes go together",
        ),
        (
            {"holders": [{"name": "plex", "pulse_period": "0s", "pulse_bytes": "1GiB"}]},
            "holders[0].pulse_period: must be positive",
        ),
    ],
)
def test_a_bad_host_file_exits_2_naming_the_file_and_field(
    tmp_path: Path, content: dict[str, object], expected: str
) -> None:
    host_file = tmp_path / "bad-host.yaml"
    host_file.write_text(yaml.safe_dump(content))
    result = subprocess.run(
        [sys.executable, "-m", "gpugate", "sim", "run", str(host_file)],
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT,
    )
    assert result.returncode == 2
    assert result.stdout == ""
    assert result.stderr.startswith(f"gpugate sim run: {host_file}: ")
    assert expected in result.stderr


def test_a_pulsing_holder_in_a_host_file(tmp_path: Path) -> None:
    plex = {
        "name": "Plex Transcoder",
        "bytes": "300MiB",
        "pulse_period": "1m30s",
        "pulse_bytes": "1.5GiB",
    }
    (spec,) = load_host(write_host(tmp_path / "host.yaml", [plex])).holders
    assert (spec.pulse_period, spec.pulse_bytes) == (90.0, 1536 * MiB)
    argv = holder_argv(spec, tmp_path)
    assert argv[argv.index("--pulse-period") + 1] == "90.0"
    assert argv[argv.index("--pulse-bytes") + 1] == str(1536 * MiB)
    assert argv[argv.index("--") + 1 :] == ["Plex Transcoder"], "no command: the name is shown"


def test_a_missing_host_file_exits_2(tmp_path: Path) -> None:
    missing = tmp_path / "nope.yaml"
    result = subprocess.run(
        [sys.executable, "-m", "gpugate", "sim", "run", str(missing)],
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT,
    )
    assert result.returncode == 2
    assert f"gpugate sim run: {missing}: " in result.stderr
    assert "No such file" in result.stderr


# -- the in-process API ---------------------------------------------------------------------------


def incident_without_ollama(
    tmp_path: Path, whisper_port: int = 8081, comfyui_port: int = 8189
) -> HostSpec:
    data = yaml.safe_load(INCIDENT.read_text())
    data.pop("ollama")
    data["whisper"]["listen"] = f"127.0.0.1:{whisper_port}"
    data["comfyui"]["listen"] = f"127.0.0.1:{comfyui_port}"
    path = tmp_path / "incident-holders.yaml"
    path.write_text(yaml.safe_dump(data))
    return load_host(path)


def test_the_incident_holders(tmp_path: Path) -> None:
    port, comfyui_port = free_ports(2)
    spec = incident_without_ollama(tmp_path, port, comfyui_port)
    with SimulatedHost(spec) as host:
        assert host.gpu is not None and host.state_dir is not None
        state = host.gpu.read()
        (device,) = state.devices
        assert (device.total, device.reserved) == (TOTAL, RESERVED)
        assert device.uuid == default_gpu_uuid(0)
        assert sorted(p.used for p in state.processes) == [210 * MiB, 292 * MiB, 2050 * MiB]
        assert host.gpu.free() == TOTAL - RESERVED - (2050 + 292 + 210) * MiB
        commands = sorted(" ".join(cmdline(p.pid)) for p in state.processes)
        assert commands == sorted(
            [
                f"python3 ComfyUI/main.py --listen 127.0.0.1 --port {comfyui_port}",
                "python3 /opt/mvoice/mvoice_server.py --host 127.0.0.1 --port 8765",
                f"whisper-server -m models/ggml-large-v3-turbo.bin --host 127.0.0.1 --port {port}",
            ]
        )
        # whisper-server and ComfyUI are simulated runtimes now, not holders.
        assert host.ready_line() == (
            "# simulated host ready: 1 GPU(s), 1 holder(s), "
            f"whisper-server at http://127.0.0.1:{port}, "
            f"comfyui at http://127.0.0.1:{comfyui_port}"
        )
        pids = host.pids
        state_dir = host.state_dir
    assert [pid for pid in pids if pid_exists(pid)] == []
    assert not state_dir.exists()


def test_the_incident_file_describes_the_incident(tmp_path: Path) -> None:
    data = yaml.safe_load(INCIDENT.read_text())
    (gpu,) = data["gpus"]
    assert (gpu["total"], gpu["reserved"]) == ("16GiB", "434MiB")
    spec = load_host(INCIDENT).ollama
    assert spec is not None and spec.listen == "127.0.0.1:11435"
    assert [(p.model, p.keep_alive) for p in spec.preload] == [
        ("gemma3:12b", "24h"),
        ("bge-m3", "24h"),
    ]
    # Each model is its shape: a runner holds what llama-server holds for its blob.
    runners = {}
    for model in spec.models:
        assert model.size == 0 and model.head_count > 0
        blob = tmp_path / model.name.replace(":", "-")
        write_blob(blob, model)
        context = min(4096, model.context_length)
        runners[model.name] = runner_bytes(str(blob), context, 1, 512, model.embedding)
    held = sum(int(h["bytes"].removesuffix("MiB")) for h in data["holders"])
    whisper = data["whisper"]
    held += int(whisper["models"][whisper["model"]].removesuffix("MiB"))
    held += int(data["comfyui"]["context"].removesuffix("MiB"))
    preloaded = (runners["gemma3:12b"] + runners["bge-m3"]) / MiB
    assert round(preloaded) == 8330 + 1617
    free = 16384 - 434 - held - preloaded
    assert round(free) == 3451, "3,451 MiB free: too little for FLUX's text encoders (4,902)"


FAKE_OLLAMA = """
import json, signal, sys
signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
print("starting", flush=True)
print("READY http://127.0.0.1:54321", json.dumps(sys.argv[1:]), flush=True)
signal.sigwait({signal.SIGTERM})
"""


def test_ollama_is_started_after_the_holders_and_stopped_with_them(tmp_path: Path) -> None:
    source = tmp_path / "host.yaml"
    source.write_text("# read by the simulated Ollama\n")
    spec = HostSpec(
        source=source,
        gpus=(GpuSpec(total=TOTAL, reserved=RESERVED),),
        holders=(HolderSpec(name="whisper-server", bytes=GiB),),
        ollama=OllamaSpec(listen="127.0.0.1:54321"),
    )
    out = tmp_path / "forwarded.txt"
    with out.open("w") as sink:
        host = SimulatedHost(spec, ollama_command=[sys.executable, "-c", FAKE_OLLAMA], output=sink)
        with host:
            assert host.ollama_url == "http://127.0.0.1:54321"
            assert host.ready_line() == (
                "# simulated host ready: 1 GPU(s), 1 holder(s), ollama at http://127.0.0.1:54321"
            )
            ollama = host.pids[-1]
            assert cmdline(ollama)[-4:] == [
                "--host-file",
                str(source.resolve()),
                "--state-dir",
                str(host.state_dir),
            ]
            pids = host.pids
    assert len(pids) == 2
    assert [pid for pid in pids if pid_exists(pid)] == []
    assert out.read_text() == "[ollama] starting\n"


def test_an_ollama_that_fails_stops_the_host(tmp_path: Path, tag: str) -> None:
    spec = HostSpec(
        source=tmp_path / "host.yaml",
        holders=(HolderSpec(name="whisper-server", bytes=GiB, command=("whisper-server", tag)),),
        ollama=OllamaSpec(),
    )
    crash = "import sys; print('no models dir', file=sys.stderr); sys.exit(5)"
    host = SimulatedHost(spec, ollama_command=[sys.executable, "-c", crash])
    with pytest.raises(
        HostStartError, match="the simulated Ollama did not start: ollama exited with code 5"
    ):
        host.start()
    assert processes_with(tag) == []
    assert host.state_dir is not None and not host.state_dir.exists()


STUBBORN_OLLAMA = """
import signal, subprocess, sys
signal.signal(signal.SIGTERM, signal.SIG_IGN)  # inherited by the runner below
runner = subprocess.Popen([sys.executable, "-c", "import signal; signal.pause()", sys.argv[1]])
print("READY", runner.pid, flush=True)
signal.pause()
"""


def test_processes_that_ignore_sigterm_are_killed_and_reaped(tmp_path: Path, tag: str) -> None:
    spec = HostSpec(source=tmp_path / "host.yaml", ollama=OllamaSpec())
    host = SimulatedHost(spec, ollama_command=[sys.executable, "-c", STUBBORN_OLLAMA, tag])
    host.start()
    try:
        (ollama,) = host.pids
        (runner,) = set(processes_with(tag)) - {ollama}
        assert parent_pid(runner) == ollama
    finally:
        host.stop(grace=0.2)
    # Not even a zombie is left: the orphaned runner was handed to this process and reaped.
    assert (pid_exists(ollama), pid_exists(runner)) == (False, False)


def test_ollama_needs_a_host_file() -> None:
    host = SimulatedHost(HostSpec(ollama=OllamaSpec()))
    with pytest.raises(HostStartError, match=r"reads HOST\.yaml, and this host has no file"):
        host.start()
    assert host.state_dir is not None and not host.state_dir.exists()


def test_request_stop_during_start_stops_everything(tmp_path: Path, tag: str) -> None:
    spec = HostSpec(holders=(HolderSpec(name="a", bytes=MiB, command=("a", tag)),))
    host = SimulatedHost(spec)
    host.request_stop()
    with pytest.raises(Stopped):
        host.start()
    assert processes_with(tag) == []


# -- holders --------------------------------------------------------------------------------------


@pytest.fixture
def card(tmp_path: Path) -> SimulatedGpuHost:
    return SimulatedGpuHost.create(
        tmp_path / "gpu", [SimDevice(0, TOTAL, RESERVED, default_gpu_uuid(0), "card")]
    )


def holder(card: SimulatedGpuHost, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "gpugate_sim.holder", "--state-dir", str(card.directory), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_a_holder_that_does_not_fit_exits_3(card: SimulatedGpuHost) -> None:
    proc = holder(card, "--name", "whisper-server", "--bytes", "17GiB")
    stdout, stderr = proc.communicate(timeout=RUN_TIMEOUT)
    assert proc.returncode == EXIT_OOM
    assert stdout == ""
    assert stderr.startswith(
        f"OOM CUDA error: out of memory (GPU 0: pid {proc.pid} asked for {17 * GiB} bytes"
    )
    (event,) = card.ooms()
    assert (event.pid, event.name, event.requested) == (proc.pid, "whisper-server", 17 * GiB)
    assert HostState.parse(card.state_path.read_text()).processes == []


def test_a_holder_pulses_like_a_transcode(card: SimulatedGpuHost) -> None:
    proc = holder(
        card,
        "--name",
        "Plex Transcoder",
        "--bytes",
        "100MiB",
        "--pulse-period",
        "0.6",
        "--pulse-bytes",
        "1GiB",
        "--",
        "/usr/lib/plexmediaserver/Plex Transcoder",
    )
    try:
        out = LineReader(proc.stdout)
        assert out.next() == f"READY {proc.pid}"
        # Each line is printed after the change, and the next change is a period away.
        assert out.next() == f"PULSE ON {GiB}"
        assert card.read().held_by(proc.pid, 0) == 100 * MiB + GiB
        assert out.next() == "PULSE OFF"
        assert card.read().held_by(proc.pid, 0) == 100 * MiB
        assert comm(proc.pid) == "Plex Transcoder"
        assert cmdline(proc.pid) == ["/usr/lib/plexmediaserver/Plex Transcoder"]
        proc.terminate()
        assert proc.wait(timeout=RUN_TIMEOUT) == 0
    finally:
        kill_quietly(proc)
    assert HostState.parse(card.state_path.read_text()).processes == [], "released, not pruned"


def test_a_pulse_that_does_not_fit_is_skipped(card: SimulatedGpuHost) -> None:
    card.allocate(os.getpid(), TOTAL - RESERVED - GiB, name="pytest")
    proc = holder(
        card,
        "--name",
        "Plex Transcoder",
        "--bytes",
        "512MiB",
        "--pulse-period",
        "5",
        "--pulse-bytes",
        "1GiB",
    )
    try:
        out = LineReader(proc.stdout)
        assert out.next() == f"READY {proc.pid}"
        assert out.next() == f"PULSE OOM {GiB}"
        assert card.read().held_by(proc.pid, 0) == 512 * MiB
        assert [e.requested for e in card.ooms()] == [GiB]
        proc.terminate()
        assert proc.wait(timeout=RUN_TIMEOUT) == 0
    finally:
        kill_quietly(proc)
    assert card.read().held_by(proc.pid, 0) == 0


def test_a_holder_dies_with_its_parent(card: SimulatedGpuHost) -> None:
    command = [
        sys.executable,
        "-m",
        "gpugate_sim.holder",
        "--state-dir",
        str(card.directory),
        "--name",
        "orphan",
        "--bytes",
        "1GiB",
    ]
    shell = subprocess.Popen(
        ["sh", "-c", '"$@" & wait', "sh", *command], stdout=subprocess.PIPE, text=True
    )
    try:
        out = LineReader(shell.stdout)
        pid = int(out.until("READY").split()[1])
        assert parent_pid(pid) == shell.pid
        assert card.read().held_by(pid, 0) == GiB
        shell.kill()
        shell.wait(timeout=RUN_TIMEOUT)
        # The holder keeps the pipe open until it has exited.
        assert out.rest() == []
    finally:
        kill_quietly(shell)
    assert HostState.parse(card.state_path.read_text()).processes == [], "it released first"


def test_a_holder_refuses_a_missing_state_dir(tmp_path: Path) -> None:
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "gpugate_sim.holder",
            "--state-dir",
            str(tmp_path / "none"),
            "--name",
            "x",
            "--bytes",
            "1",
        ],
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT,
    )
    assert result.returncode == 1
    assert f"no simulated host in {tmp_path / 'none'}" in result.stderr
    assert not (tmp_path / "none").exists()


def test_a_command_line_that_does_not_fit_is_left_alone() -> None:
    before = Path("/proc/self/cmdline").read_bytes()
    assert set_cmdline(["x" * 1_000_000]) is False
    assert Path("/proc/self/cmdline").read_bytes() == before
