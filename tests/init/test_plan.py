"""What init proposes for hosts it cannot simulate whole: vLLM, llama-server, containers,
hand-started runtimes, taken ports, units with drop-ins of their own. Every proposal must
load as a consumers.yaml; the drop-ins must pass `systemd-analyze verify`."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
from pathlib import Path

import attrs
import pytest

from gpugate.core.classes import PriorityClass, ResidencyPolicy
from gpugate.init.namespaces import HERE, Namespaces, Sharing
from gpugate.init.plan import Options, Plan
from gpugate.init.planning import make_plan
from gpugate.init.proc import Listener, Process
from gpugate.init.recognise import recognise
from gpugate.init.scan import Device, GpuProcess, HostScan
from gpugate.init.systemd import UnitInfo
from gpugate.init.write import render_files
from gpugate.packaged import SHARE
from gpugate.runtimes.sections import load_config_text_with_warnings

MiB = 1024 * 1024
GiB = 1024 * MiB
TOKEN_WARNINGS = {"gate.control_tokens[0]", "gate.control_tokens[1].token"}


class Host:
    """A host written as records: processes, their sockets, their memory on one card."""

    def __init__(self, total: int = 24 * GiB) -> None:
        self.processes: dict[int, Process] = {}
        self.listeners: list[Listener] = []
        self.gpu: list[GpuProcess] = []
        self.units: dict[str, UnitInfo] = {}
        self.device = Device(0, "NVIDIA GeForce RTX 4090", "GPU-0000", total, 500 * MiB, 0)
        self.more_devices: list[Device] = []
        self._pid = 1000
        self._inode = 5000

    def add(
        self,
        argv: list[str],
        *,
        env: dict[str, str] | None = None,
        listen: tuple[str, int] | None = None,
        ppid: int = 1,
        holds: int = 0,
        unit: str | None = None,
        exec_start: list[str] | None = None,
        drop_ins: tuple[str, ...] = (),
        environment_files: tuple[str, ...] = (),
        unit_environment: dict[str, str] | None = None,
        container: str | None = None,
        user_unit: bool = False,
        cwd: str = "/",
        gpu: int = 0,
        namespaces: Namespaces = HERE,
    ) -> int:
        self._pid += 1
        pid = self._pid
        sockets = set()
        if listen is not None:
            self._inode += 1
            sockets.add(str(self._inode))
            self.listeners.append(Listener(listen[0], listen[1], str(self._inode)))
        self.processes[pid] = Process(
            pid=pid,
            ppid=ppid,
            comm=os.path.basename(argv[0])[:15],
            argv=tuple(argv),
            env=env or {},
            cwd=Path(cwd),
            unit=unit,
            user_unit=user_unit,
            container=container,
            sockets=frozenset(sockets),
            namespaces=namespaces,
        )
        if holds:
            self.gpu.append(GpuProcess(pid, gpu, holds))
        if unit is not None and not user_unit and container is None:
            self.units[unit] = UnitInfo(
                unit,
                load_state="loaded",
                active_state="active",
                exec_start=tuple(exec_start or argv),
                drop_in_paths=drop_ins,
                # What the unit's Environment= says: by default all of its environment.
                environment=env or {} if unit_environment is None else unit_environment,
                environment_files=environment_files,
            )
        return pid

    def listen_elsewhere(self, port: int, host: str = "127.0.0.1") -> None:
        """Something init does not know listens on `port`."""
        self._inode += 1
        self.listeners.append(Listener(host, port, str(self._inode)))

    def plan(self, **options: object) -> Plan:
        scan = HostScan(
            hostname="gpuhost",
            proc_root=Path("/proc"),
            driver_version="550.54.15",
            devices=(self.device, *self.more_devices),
            gpu_processes=tuple(self.gpu),
            processes=self.processes,
            listeners=tuple(self.listeners),
        )
        return make_plan(scan, recognise(scan), self.units, Options(**options))  # type: ignore[arg-type]


def render(plan: Plan, tmp_path: Path) -> tuple[dict[str, str], object, set[str]]:
    """The files, the loaded configuration, and the paths of its warnings."""
    files = render_files(plan)
    loaded = load_config_text_with_warnings(files["consumers.yaml"], tmp_path / "consumers.yaml")
    return files, loaded.config, {w.path for w in loaded.warnings}


def consumer(config: object, name: str):  # type: ignore[no-untyped-def]
    return next(c for c in config.consumers if c.name == name)  # type: ignore[attr-defined]


def exec_start(drop_in: str) -> list[str]:
    (line,) = [x for x in drop_in.splitlines() if x.startswith("ExecStart=") and x != "ExecStart="]
    return shlex.split(line.split("=", 1)[1])


@pytest.fixture(autouse=True)
def no_credentials(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CREDENTIALS_DIRECTORY", raising=False)


def test_the_gate_takes_the_runtime_s_address_and_the_runtime_the_next_free_port(
    tmp_path: Path,
) -> None:
    host = Host()
    host.add(
        ["/usr/local/bin/ollama", "serve"],
        env={"OLLAMA_HOST": "0.0.0.0"},
        listen=("0.0.0.0", 11434),
        unit="ollama.service",
        exec_start=["/usr/local/bin/ollama", "serve"],
    )
    host.listen_elsewhere(11435)  # taken: Ollama moves to 11436
    host.listen_elsewhere(9411)  # taken: the control listener moves on
    plan = host.plan()
    files, config, warnings = render(plan, tmp_path)
    ollama = consumer(config, "ollama")
    assert str(ollama.listen) == "0.0.0.0:11434"
    assert (ollama.upstream.host, ollama.upstream.port) == ("127.0.0.1", 11436)
    assert str(config.gate.control) == "127.0.0.1:9412"
    assert "port 9411 is taken: the control listener is 127.0.0.1:9412" in files["moves.txt"]
    assert warnings == {"gate.control_tokens[0]"}  # no start is admitted: one token
    assert "Environment=OLLAMA_HOST=127.0.0.1:11436" in files["ollama.service.d/gpugate.conf"]
    # OLLAMA_HOST came from the unit's Environment=, so the drop-in's wins: no note.
    assert "EnvironmentFile" not in files["moves.txt"]


def test_an_address_from_an_environment_file_is_named_where_to_change_it(tmp_path: Path) -> None:
    host = Host()
    host.add(
        ["/usr/local/bin/ollama", "serve"],
        env={"OLLAMA_HOST": "0.0.0.0:11434"},
        listen=("0.0.0.0", 11434),
        unit="ollama.service",
        unit_environment={},
        environment_files=("/etc/default/ollama",),
    )
    files, _, _ = render(host.plan(), tmp_path)
    assert "comes from elsewhere (/etc/default/ollama)" in files["moves.txt"]


def test_a_runtime_on_ipv6_any_is_fronted_on_ipv4_any_with_a_note(tmp_path: Path) -> None:
    host = Host()
    host.add(
        ["python3", "/opt/ComfyUI/main.py", "--listen", "::", "--port", "8188"],
        listen=("::", 8188),
        holds=210 * MiB,
    )
    files, config, warnings = render(host.plan(), tmp_path)
    comfy = consumer(config, "comfyui")
    assert str(comfy.listen) == "0.0.0.0:8188"
    assert "IPv4 only" in files["moves.txt"]
    # Its models folder could not be read (there is none): the check's own warning stays.
    assert "consumers.comfyui" in warnings
    assert "could not be sized" in files["moves.txt"]


def test_vllm_is_sized_from_what_it_holds_or_its_share_of_the_card(tmp_path: Path) -> None:
    host = Host(total=24 * GiB)
    host.add(
        ["/usr/bin/vllm", "serve", "Qwen/Qwen2.5-7B-Instruct", "--port", "8000"],
        listen=("0.0.0.0", 8000),
        holds=20 * GiB,
        unit="vllm.service",
    )
    sleepy = host.add(
        ["/usr/bin/vllm", "serve", "BAAI/bge-m3", "--task", "embed", "--port", "8010",
         "--gpu-memory-utilization", "0.25", "--enable-sleep-mode"],
        listen=("0.0.0.0", 8010),
        unit="vllm-embed.service",
    )  # fmt: skip
    files, config, _ = render(host.plan(), tmp_path)
    chat = consumer(config, "vllm-8000")
    assert chat.envelope == 20 * GiB
    assert chat.residency.policy is ResidencyPolicy.ALWAYS_WARM
    assert "without --enable-sleep-mode" in files["moves.txt"]
    embed = consumer(config, "vllm-8010")
    assert embed.envelope == 6 * GiB  # a quarter of the card: it holds nothing now
    assert embed.residency.policy is ResidencyPolicy.KEEP_WARM
    assert embed.priority is PriorityClass.BACKGROUND
    drop_in = files["vllm-embed.service.d/gpugate.conf"]
    assert "Environment=VLLM_SERVER_DEV_MODE=1" in drop_in
    argv = exec_start(drop_in)
    assert argv[argv.index("--host") + 1] == "127.0.0.1"
    assert argv[argv.index("--port") + 1] == "8011"
    assert sleepy in plan_pids(host)
    # Its share is its own command's; the other is told the share its envelope is of the
    # card (20 of 24 GiB, rounded down), whatever its version's default.
    assert argv.count("--gpu-memory-utilization") == 1
    assert argv[argv.index("--gpu-memory-utilization") + 1] == "0.25"
    chat_argv = exec_start(files["vllm.service.d/gpugate.conf"])
    assert chat_argv[-2:] == ["--gpu-memory-utilization", "0.833"]
    assert 0.833 * 24 * GiB <= chat.envelope


def plan_pids(host: Host) -> set[int]:
    return {front.found.process.pid for front in host.plan().fronts}


def test_llama_server_one_model_is_admitted_and_a_router_is_not(tmp_path: Path) -> None:
    host = Host()
    host.add(
        ["/usr/local/bin/llama-server", "-m", "/srv/gguf/qwen.gguf", "--port", "8090"],
        listen=("127.0.0.1", 8090),
        holds=5 * GiB,
        unit="llama-qwen.service",
    )
    host.add(
        ["/usr/local/bin/llama-server", "--models-dir", "/srv/gguf", "--port", "8095",
         "--embeddings"],
        listen=("0.0.0.0", 8095),
        unit="llama-router.service",
    )  # fmt: skip
    plan = host.plan(gpugate="/opt/gpugate/bin/gpugate")
    files, config, warnings = render(plan, tmp_path)
    one = consumer(config, "llama-8090")
    assert one.runtime == "llama-server"
    assert one.envelope == 5 * GiB
    assert one.control is not None and one.control.unit == "llama-qwen.service"
    assert warnings == TOKEN_WARNINGS
    qwen = files["llama-qwen.service.d/gpugate.conf"]
    # Admitted in its ExecStart, which becomes the runtime: its refusals are the unit's.
    assert "ExecStartPre" not in qwen
    admitted = exec_start(qwen)
    assert admitted[: admitted.index("--") + 1] == [
        "/opt/gpugate/bin/gpugate", "admit", "llama-8090", "--wait", "5m",
        "--config", "/etc/gpugate/consumers.yaml", "--",
    ]  # fmt: skip
    assert "RestartPreventExitStatus=64 65 77 78" in qwen
    router = consumer(config, "llama-8095")
    assert router.control is None
    assert router.residency.policy is ResidencyPolicy.KEEP_WARM
    assert router.priority is PriorityClass.BACKGROUND  # embeddings
    assert "ExecStartPre" not in files["llama-router.service.d/gpugate.conf"]
    assert router.processes.commands == ("/usr/local/bin/llama-server",)
    # The moves' own commands, in order (the undo lines name the same units).
    moves = files["moves.txt"]
    assert (
        moves.index("     sudo systemctl restart llama-router.service")
        < moves.index("     sudo systemctl enable --now gpugate.service")
        < moves.index("     sudo systemctl start llama-qwen.service")
    )


def test_a_one_model_llama_server_outside_systemd_is_started_by_the_gate(tmp_path: Path) -> None:
    host = Host()
    pid = host.add(
        ["llama-server", "-m", "/srv/gguf/qwen.gguf", "--host", "0.0.0.0", "--port", "8090"],
        listen=("0.0.0.0", 8090),
        holds=5 * GiB,
    )
    files, config, warnings = render(host.plan(), tmp_path)
    llama = consumer(config, "llama")
    assert llama.control is not None
    assert llama.control.command == (
        "llama-server", "-m", "/srv/gguf/qwen.gguf", "--host", "127.0.0.1", "--port", "8091"
    )  # fmt: skip
    assert llama.processes.commands == ("llama-server -m",)
    assert f"kill {pid}" in files["moves.txt"]
    assert warnings == {"gate.control_tokens[0]"}


def test_a_runtime_started_by_hand_is_moved_by_hand(tmp_path: Path) -> None:
    host = Host()
    pid = host.add(
        ["whisper-server", "-m", "models/ggml-base.en.bin", "--port", "8080"],
        env={"CUDA_VISIBLE_DEVICES": "1", "HF_TOKEN": "hf_live_secret", "PATH": "/opt/w/bin"},
        cwd="/srv/whisper",
        listen=("127.0.0.1", 8080),
        holds=300 * MiB,
    )
    plan = host.plan(out=tmp_path / "proposal")
    files, config, _ = render(plan, tmp_path)
    whisper = consumer(config, "whisper")
    assert whisper.control is None and whisper.envelope == 300 * MiB
    assert list(files) == ["consumers.yaml", "whisper.env", "gpugate.service", "moves.txt"]
    # The environment it has, every variable, written to a file the commands read: the
    # file holds the secret, the print of it does not.
    env = tmp_path / "proposal" / "whisper.env"
    assert files["whisper.env"].splitlines()[-3:] == [
        "export CUDA_VISIBLE_DEVICES=1",
        "export HF_TOKEN=hf_live_secret",
        "export PATH=/opt/w/bin",
    ]
    shown = render_files(plan, shown=True)
    assert "export HF_TOKEN='***'" in shown["whisper.env"]
    assert "hf_live_secret" not in "".join(v for k, v in shown.items())
    assert "hf_live_secret" not in files["moves.txt"]
    moves = files["moves.txt"].splitlines()
    start = f'cd /srv/whisper && env -i /bin/sh -c \'. "$0" && exec "$@"\' {env} '
    at = moves.index(f"     kill {pid}")
    assert moves[at + 1] == (
        f"     {start}whisper-server -m models/ggml-base.en.bin --port 8081 --host 127.0.0.1"
    )
    assert moves[at + 2] == f"   undo: {start}whisper-server -m models/ggml-base.en.bin --port 8080"


def test_an_ollama_started_by_hand_keeps_its_environment_with_its_address_moved(
    tmp_path: Path,
) -> None:
    host = Host()
    host.add(
        ["ollama", "serve"],
        env={"OLLAMA_HOST": "0.0.0.0:11434", "OLLAMA_MODELS": "/data/models"},
        cwd="/home/alice",
        listen=("0.0.0.0", 11434),
    )
    plan = host.plan(out=tmp_path)
    files, config, _ = render(plan, tmp_path)
    assert str(consumer(config, "ollama").listen) == "0.0.0.0:11434"
    assert "export OLLAMA_MODELS=/data/models" in files["ollama.env"]
    assert "export OLLAMA_HOST=0.0.0.0:11434" in files["ollama.env"]  # as it was: the undo's
    start = f'cd /home/alice && env -i /bin/sh -c \'. "$0" && exec "$@"\' {tmp_path}/ollama.env'
    moves = files["moves.txt"]
    assert (
        f"     {start} env OLLAMA_HOST=127.0.0.1:11435 OLLAMA_KEEP_ALIVE=-1 ollama serve\n" in moves
    )
    assert f"   undo: {start} ollama serve\n" in moves


def test_what_cannot_be_read_of_a_process_started_by_hand_is_said(tmp_path: Path) -> None:
    host = Host()
    pid = host.add(["ollama", "serve"], listen=("127.0.0.1", 11434))
    process = host.processes[pid]
    host.processes[pid] = attrs.evolve(process, env=None, cwd=None)
    files, _, _ = render(host.plan(), tmp_path)
    assert list(files) == ["consumers.yaml", "gpugate.service", "moves.txt"]
    moves = files["moves.txt"]
    assert "     OLLAMA_HOST=127.0.0.1:11435 OLLAMA_KEEP_ALIVE=-1 ollama serve\n" in moves
    assert "its environment could not be read" in moves
    assert "its working directory could not be read" in moves


def test_a_container_s_runtime_is_fronted_without_a_drop_in(tmp_path: Path) -> None:
    host = Host()
    host.add(
        ["/bin/ollama", "serve"],
        env={"OLLAMA_HOST": "0.0.0.0:11434"},
        holds=2 * GiB,
        container="docker-3f2a9c.scope",
    )
    files, config, _ = render(host.plan(), tmp_path)
    ollama = consumer(config, "ollama")
    assert str(ollama.listen) == "0.0.0.0:11434"
    assert ollama.processes.units == ()
    assert list(files) == ["consumers.yaml", "gpugate.service", "moves.txt"]
    assert "Publish ollama's container port on 127.0.0.1:11435" in files["moves.txt"]


def test_a_drop_in_that_would_be_overridden_is_named_to_apply_last(tmp_path: Path) -> None:
    host = Host()
    host.add(
        ["/usr/local/bin/ollama", "serve"],
        env={"OLLAMA_HOST": "0.0.0.0"},
        listen=("0.0.0.0", 11434),
        unit="ollama.service",
        drop_ins=("/etc/systemd/system/ollama.service.d/override.conf",),
    )
    files, _, _ = render(host.plan(), tmp_path)
    drop_in = files["ollama.service.d/zz-gpugate.conf"]
    assert "to apply after override.conf" in drop_in
    assert "/etc/systemd/system/ollama.service.d/zz-gpugate.conf" in files["moves.txt"]


def test_a_unit_that_runs_a_wrapper_gets_the_runtime_s_own_command(tmp_path: Path) -> None:
    host = Host()
    host.add(
        ["/opt/ComfyUI/venv/bin/python", "/opt/ComfyUI/main.py", "--port", "8188"],
        listen=("127.0.0.1", 8188),
        unit="comfyui.service",
        exec_start=["/opt/ComfyUI/start.sh"],
    )
    files, _, _ = render(host.plan(), tmp_path)
    assert exec_start(files["comfyui.service.d/gpugate.conf"]) == [
        "/opt/ComfyUI/venv/bin/python", "/opt/ComfyUI/main.py", "--port", "8189",
        "--listen", "127.0.0.1", "--reserve-vram", "1",
    ]  # fmt: skip
    assert "comfyui.service runs /opt/ComfyUI/start.sh" in files["moves.txt"]


def test_two_of_a_kind_are_named_by_port(tmp_path: Path) -> None:
    host = Host()
    host.add(["ollama", "serve"], listen=("127.0.0.1", 11434))
    host.add(["ollama", "serve"], env={"OLLAMA_HOST": "0.0.0.0:11500"}, listen=("0.0.0.0", 11500))
    _, config, _ = render(host.plan(), tmp_path)
    assert [c.name for c in config.consumers] == ["ollama-11434", "ollama-11500"]


def test_a_host_with_nothing_to_front_still_writes_a_loadable_file(tmp_path: Path) -> None:
    host = Host()
    host.add(["/usr/lib/plexmediaserver/Plex Media Server"], unit="plexmediaserver.service")
    stray = host.add(["python3", "/opt/mvoice/mvoice_server.py"], holds=292 * MiB)
    files, config, warnings = render(host.plan(), tmp_path)
    assert config.consumers == ()
    assert [e.name for e in config.external] == ["plex"]
    assert "consumers" in warnings
    assert (
        f"unknown: pid {stray}, python3 /opt/mvoice/mvoice_server.py, 292 MiB" in files["moves.txt"]
    )


# -- the drop-ins, as systemd reads them -----------------------------------------------------

ANALYZE = shutil.which("systemd-analyze")
EXAMPLES = SHARE / "systemd" / "examples"


def _example_exec_start(unit: str) -> list[str]:
    text = (EXAMPLES / unit).read_text()
    (line,) = [x for x in text.splitlines() if x.startswith("ExecStart=")]
    return shlex.split(line.split("=", 1)[1])


@pytest.mark.skipif(ANALYZE is None, reason="systemd-analyze is part of every systemd host")
def test_the_drop_ins_verify_against_the_shipped_example_units(tmp_path: Path) -> None:
    true = shutil.which("true")
    assert true is not None
    host = Host()
    for unit, listen, holds in (
        ("ollama.service", ("0.0.0.0", 11434), 0),
        ("comfyui.service", ("0.0.0.0", 8188), 210 * MiB),
        ("whisper-server.service", ("0.0.0.0", 8080), 2050 * MiB),
    ):
        argv = _example_exec_start(unit)
        host.add(argv, listen=listen, holds=holds, unit=unit, exec_start=argv, cwd="/opt/ComfyUI")
    plan = host.plan(gpugate=true)
    files = render_files(plan)
    assert sorted(p for p in files if p.endswith(".conf")) == [
        "comfyui.service.d/gpugate.conf",
        "ollama.service.d/gpugate.conf",
        "whisper-server.service.d/gpugate.conf",
    ]
    programs = ("/usr/local/bin/ollama", "/usr/local/bin/whisper-server",
                "/opt/ComfyUI/venv/bin/python")  # fmt: skip

    def runnable(text: str) -> str:
        for program in programs:
            text = text.replace(program, true)
        return text

    (tmp_path / "gpugate.service").write_text(files["gpugate.service"])
    for unit in ("ollama.service", "comfyui.service", "whisper-server.service"):
        (tmp_path / unit).write_text(runnable((EXAMPLES / unit).read_text()))
        (tmp_path / f"{unit}.d").mkdir()
        (tmp_path / f"{unit}.d" / "gpugate.conf").write_text(
            runnable(files[f"{unit}.d/gpugate.conf"])
        )
    for unit in ("ollama.service", "comfyui.service", "whisper-server.service"):
        result = subprocess.run(
            [ANALYZE, "verify", str(tmp_path / unit)], capture_output=True, text=True, timeout=60
        )
        problems = [line for line in result.stderr.splitlines() if unit in line]
        assert result.returncode == 0 and problems == [], result.stderr
    whisper = files["whisper-server.service.d/gpugate.conf"]
    command = exec_start(whisper)
    assert command[command.index("--") + 1 :] == [
        "/usr/local/bin/whisper-server", "-m", "/var/lib/whisper/models/ggml-large-v3.bin",
        "--host", "127.0.0.1", "--port", "8081",
    ]  # fmt: skip
    assert command[1:3] == ["admit", "whisper"]
    assert "LoadCredential=gpugate-token:/etc/gpugate/admit.token" in whisper
    assert exec_start(files["comfyui.service.d/gpugate.conf"])[-6:] == [
        "--listen", "127.0.0.1", "--port", "8189", "--reserve-vram", "1",
    ]  # fmt: skip


def test_secrets_on_a_command_line_are_not_copied_into_what_init_prints(tmp_path: Path) -> None:
    host = Host()
    host.add(
        ["vllm", "serve", "m", "--api-key", "sk-live-123", "--hf-token=hf_abc", "--port", "8000"],
        listen=("0.0.0.0", 8000),
        holds=10 * GiB,
    )
    files, _, _ = render(host.plan(), tmp_path)
    printed = "".join(files.values())
    assert "sk-live-123" not in printed and "hf_abc" not in printed
    assert "--api-key '***' '--hf-token=***'" in files["moves.txt"]
    assert "with your values in place of ***" in " ".join(files["moves.txt"].split())


def test_a_gate_already_running_is_pointed_out(tmp_path: Path) -> None:
    host = Host()
    host.add(["/usr/local/bin/gpugate", "serve", "--config", "/etc/gpugate/consumers.yaml"])
    host.add(
        ["ollama", "serve"], env={"OLLAMA_HOST": "127.0.0.1:11435"}, listen=("127.0.0.1", 11435)
    )
    files, _, _ = render(host.plan(), tmp_path)
    assert "a gate already runs here (pid 1001" in files["moves.txt"]


def test_comfyui_s_flags_and_model_files_are_carried_over(tmp_path: Path) -> None:
    from gpugate.runtimes.comfyui.settings import ComfyUISettings

    base = tmp_path / "srv" / "comfy"
    checkpoint = base / "models" / "checkpoints" / "[v2] sd.safetensors"
    checkpoint.parent.mkdir(parents=True)
    with open(checkpoint, "wb") as fh:
        fh.truncate(2034 * MiB)
    host = Host()
    host.add(
        ["python3", "main.py", "--enable-cors-header", "--max-upload-size", "200",
         "--listen", "0.0.0.0"],
        listen=("0.0.0.0", 8188),
        cwd=str(base),
    )  # fmt: skip
    _, config, warnings = render(host.plan(), tmp_path)
    comfy = consumer(config, "comfyui")
    settings = comfy.settings_as(ComfyUISettings)
    assert settings.cors_header == "*"
    assert comfy.max_body == 200 * MiB
    ((pattern, nbytes),) = [(f.pattern, f.size) for f in settings.files]
    assert (pattern.folder, pattern.name, nbytes) == (
        "checkpoints",
        "[[]v2] sd.safetensors",
        2034 * MiB,
    )
    assert settings.file_size("checkpoints", "[v2] sd.safetensors") == 2034 * MiB
    assert warnings == {"gate.control_tokens[0]"}


def test_an_ollama_that_sees_two_cards_is_given_both(tmp_path: Path) -> None:
    host = Host()
    host.more_devices.append(Device(1, "NVIDIA GeForce RTX 4080", "GPU-0001", 16 * GiB, 0, 0))
    server = host.add(
        ["/usr/local/bin/ollama", "serve"],
        listen=("127.0.0.1", 11434),
        unit="ollama.service",
    )
    host.add(["/usr/local/bin/ollama", "runner"], ppid=server, holds=2 * GiB, gpu=1)
    files, config, _ = render(host.plan(), tmp_path)
    assert consumer(config, "ollama").cards == (0, 1)
    assert "    gpus: [0, 1]" in files["consumers.yaml"]
    assert "Ollama sees GPUs 0, 1" in files["consumers.yaml"]


def test_an_ollama_shown_one_card_of_two_stays_on_it(tmp_path: Path) -> None:
    host = Host()
    host.more_devices.append(Device(1, "NVIDIA GeForce RTX 4080", "GPU-0001", 16 * GiB, 0, 0))
    server = host.add(
        ["/usr/local/bin/ollama", "serve"],
        env={"CUDA_VISIBLE_DEVICES": "1"},
        listen=("127.0.0.1", 11434),
        unit="ollama.service",
    )
    host.add(["/usr/local/bin/ollama", "runner"], ppid=server, holds=2 * GiB, gpu=1)
    files, config, _ = render(host.plan(), tmp_path)
    assert consumer(config, "ollama").cards == (1,)
    assert "    gpu: 1" in files["consumers.yaml"]


ELSEWHERE = Namespaces(net=Sharing.OTHER, net_id="net:[4026532175]")


def test_a_runtime_in_another_network_namespace_is_proposed_only_when_named(
    tmp_path: Path,
) -> None:
    host = Host()
    host.add(["ollama", "serve"], listen=("127.0.0.1", 11434), unit="ollama.service")
    # A unit with PrivateNetwork=, listening on every address of its own namespace.
    there = host.add(
        ["ollama", "serve"],
        env={"OLLAMA_HOST": "0.0.0.0:11500"},
        unit="ollama-lab.service",
        namespaces=ELSEWHERE,
    )
    files, config, _ = render(host.plan(), tmp_path)
    assert [c.name for c in config.consumers] == ["ollama"]
    assert list(files) == [
        "consumers.yaml",
        "ollama.service.d/gpugate.conf",
        "gpugate.service",
        "moves.txt",
    ]
    assert "11500" not in files["consumers.yaml"]
    assert " ".join(
        f"ollama pid {there} not fronted: it runs in another network namespace "
        "(net:[4026532175]): its addresses are that namespace's, not this one's; name it "
        f"(--pid {there}) to propose it all the same".split()
    ) in " ".join(files["moves.txt"].split())

    files, config, _ = render(host.plan(named=frozenset({there})), tmp_path)
    assert {c.name: str(c.listen) for c in config.consumers} == {
        "ollama-11434": "127.0.0.1:11434",
        "ollama-11500": "0.0.0.0:11500",
    }
    # No drop-in moves it to a loopback the gate cannot reach, and nothing restarts it.
    assert list(files) == [
        "consumers.yaml",
        "ollama.service.d/gpugate.conf",
        "gpugate.service",
        "moves.txt",
    ]
    assert "ollama-lab.service" not in files["moves.txt"].split("Notes:")[0].split("Moves")[1]
    assert "Forward ollama-11500's port from its network namespace to 127.0.0.1:11501" in (
        " ".join(files["moves.txt"].split())
    )


def test_a_named_pid_that_is_no_runtime_is_said(tmp_path: Path) -> None:
    host = Host()
    plex = host.add(["/usr/lib/plexmediaserver/Plex Media Server"])
    files, _, _ = render(host.plan(named=frozenset({plex, 99999})), tmp_path)
    notes = " ".join(files["moves.txt"].split())
    assert "--pid 99999: no such process" in notes
    assert f"--pid {plex}: '/usr/lib/plexmediaserver/Plex Media Server' is no runtime" in notes


def test_a_client_of_an_address_the_gate_does_not_take_is_warned(tmp_path: Path) -> None:
    host = Host()
    pid = host.add(["ollama", "serve"], listen=("192.168.1.5", 11434))
    process = host.processes[pid]
    host.listeners.append(Listener("127.0.0.1", 11434, "9999"))
    host.processes[pid] = attrs.evolve(process, sockets=process.sockets | {"9999"})
    files, config, _ = render(host.plan(), tmp_path)
    assert str(consumer(config, "ollama").listen) == "192.168.1.5:11434"
    assert (
        "it also listens on 127.0.0.1:11434: the gate takes 192.168.1.5:11434 only, and a "
        "client that connects there now gets no answer once it moves"
    ) in " ".join(files["moves.txt"].split())


def moves_of(text: str) -> list[tuple[str, list[str], str]]:
    """The numbered moves of a moves.txt: (title, commands, undo)."""
    found: list[tuple[str, list[str], str]] = []
    for block in text.split("Notes:")[0].split("\n\n"):
        lines = block.splitlines()
        if not lines or not lines[0][:1].isdigit():
            continue
        title = [lines[0].split(" ", 1)[1]]
        title += [line.strip() for line in lines[1:] if line.startswith("   ") and line[3] != " "
                  and not line.startswith("   undo:")]  # fmt: skip
        commands = [line.strip() for line in lines if line.startswith("     ")]
        undo = [line.removeprefix("   undo: ") for line in lines if line.startswith("   undo:")]
        found.append((" ".join(title), commands, undo[0] if undo else ""))
    return found


def test_every_move_that_changes_the_host_prints_its_undo(tmp_path: Path) -> None:
    host = Host()
    host.add(["ollama", "serve"], listen=("0.0.0.0", 11434), unit="ollama.service")
    host.add(
        ["whisper-server", "-m", "/m/base.bin", "--port", "8080"],
        listen=("127.0.0.1", 8080),
        holds=300 * MiB,
        unit="whisper.service",
    )
    host.add(["python3", "/opt/ComfyUI/main.py", "--port", "8188"], listen=("127.0.0.1", 8188))
    files, _, _ = render(host.plan(root=tmp_path / "empty"), tmp_path)
    moves = moves_of(files["moves.txt"])
    undos = {title[:31]: undo for title, _, undo in moves}
    assert [undo == "" for _, _, undo in moves] == [False] * (len(moves) - 1) + [True]
    assert undos == {
        "Review the files, then install ": "sudo rm -f /etc/gpugate/consumers.yaml",
        "Make the control tokens, each i": "sudo rm -f /etc/gpugate/control.token "
        "/etc/gpugate/admit.token",
        "Install the drop-ins:": "sudo rm -f /etc/systemd/system/ollama.service.d/gpugate.conf "
        "/etc/systemd/system/whisper.service.d/gpugate.conf && sudo systemctl daemon-reload",
        "Move each runtime to its loopba": "sudo rm -f "
        "/etc/systemd/system/ollama.service.d/gpugate.conf && sudo systemctl daemon-reload "
        "&& sudo systemctl restart ollama.service",
        "Stop the runtimes whose start t": "sudo rm -f "
        "/etc/systemd/system/whisper.service.d/gpugate.conf && sudo systemctl daemon-reload "
        "&& sudo systemctl start whisper.service",
        "Stop comfyui (pid 1003, started": 'cd / && env -i /bin/sh -c \'. "$0" && exec '
        f'"$@"\' {Path.cwd()}/gpugate-init/comfyui.env python3 /opt/ComfyUI/main.py --port 8188',
        "Install and start the gate: gpu": "sudo systemctl disable --now gpugate.service && "
        "sudo rm -f /etc/systemd/system/gpugate.service && sudo systemctl daemon-reload",
        "Start the admitted runtimes (ea": "sudo systemctl stop whisper.service",
        "Check the budget and each runti": "",
    }


def test_a_move_never_replaces_a_file_that_is_there(tmp_path: Path) -> None:
    root = tmp_path / "root"
    for path in (
        "etc/gpugate/consumers.yaml",
        "etc/gpugate/control.token",
        "etc/systemd/system/gpugate.service",
        "etc/systemd/system/ollama.service.d/gpugate.conf",
    ):
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_text("mine\n")
    host = Host()
    host.add(["ollama", "serve"], listen=("0.0.0.0", 11434), unit="ollama.service")
    host.add(["python3", "/opt/ComfyUI/main.py"], listen=("127.0.0.1", 8188), unit="comfy.service")
    files, _, _ = render(host.plan(root=root), tmp_path)
    moves = moves_of(files["moves.txt"])
    commands = [command for _, listed, _ in moves for command in listed]
    undos = " ".join(undo for _, _, undo in moves)
    assert not [c for c in commands if "/etc/gpugate/consumers.yaml" in c and "install" in c]
    assert not [c for c in commands if "openssl" in c]  # the token is there: kept
    assert "sudo systemctl enable --now gpugate.service" in commands
    assert not [c for c in commands if "install" in c and "gpugate.service " in c + " "]
    assert not [c for c in commands if c.endswith("ollama.service.d/gpugate.conf")]
    assert [c for c in commands if c.endswith("comfy.service.d/gpugate.conf")]
    for kept in ("consumers.yaml", "control.token", "gpugate.service", "ollama.service.d"):
        assert kept not in undos.replace("gpugate.service &&", "").replace(
            "disable --now gpugate.service", ""
        ), kept
    text = " ".join(files["moves.txt"].split())
    assert "A configuration is installed at /etc/gpugate/consumers.yaml already" in text
    assert "/etc/systemd/system/ollama.service.d/gpugate.conf is there already" in text
    assert "/etc/systemd/system/gpugate.service is there already" in text


def test_the_gate_s_unit_is_the_packaged_one_for_this_gpugate(tmp_path: Path) -> None:
    shipped = (SHARE / "systemd" / "gpugate.service").read_text()
    admitted = Host()
    admitted.add(
        ["whisper-server", "-m", "/m/base.bin", "--port", "8080"],
        listen=("127.0.0.1", 8080),
        holds=300 * MiB,
        unit="whisper.service",
    )
    files, _, _ = render(admitted.plan(gpugate="/opt/gpugate/bin/gpugate"), tmp_path)
    unit = files["gpugate.service"]
    assert unit.endswith(shipped.replace("/usr/local/bin/gpugate", "/opt/gpugate/bin/gpugate"))
    assert "LoadCredential=admit.token:/etc/gpugate/admit.token" in unit
    moves = " ".join(files["moves.txt"].split())
    assert "sudo install -m 0644 gpugate-init/gpugate.service /etc/systemd/system/" in moves
    assert "sandbox hides" not in moves

    # Nothing admitted: no admit token to load. A gpugate under /home cannot run in the
    # unit's sandbox (ProtectHome=): the move says so.
    moved = Host()
    moved.add(["ollama", "serve"], listen=("0.0.0.0", 11434), unit="ollama.service")
    files, _, _ = render(moved.plan(gpugate="/home/alice/venv/bin/gpugate"), tmp_path)
    unit = files["gpugate.service"]
    credentials = [line for line in unit.splitlines() if line.startswith("LoadCredential=")]
    assert credentials == ["LoadCredential=control.token:/etc/gpugate/control.token"]
    assert "ExecStart=/home/alice/venv/bin/gpugate serve --config" in unit
    moves = " ".join(files["moves.txt"].split())
    assert "/home/alice/venv/bin/gpugate is under /home, which the unit's sandbox hides" in moves
