"""The recognisers, on command lines and environments as /proc shows them."""

from __future__ import annotations

import os
from pathlib import Path

import attrs
import pytest

from gpugate.init.cmdline import option, program_of
from gpugate.init.namespaces import Namespaces, Sharing
from gpugate.init.proc import Listener, Process
from gpugate.init.recognise import Address, parse_ollama_host, recognise
from gpugate.init.rules import rule_for
from gpugate.init.scan import GpuProcess, HostScan

MiB = 1024 * 1024


def proc(
    argv: list[str],
    env: dict[str, str] | None = None,
    *,
    pid: int = 100,
    ppid: int = 1,
    cwd: str | None = "/",
    sockets: tuple[str, ...] = (),
) -> Process:
    return Process(
        pid=pid,
        ppid=ppid,
        comm=os.path.basename(argv[0])[:15] if argv else "",
        argv=tuple(argv),
        env=env if env is not None else {},
        cwd=Path(cwd) if cwd else None,
        sockets=frozenset(sockets),
    )


def scan_of(
    *processes: Process, gpu: tuple[GpuProcess, ...] = (), listeners: tuple[Listener, ...] = ()
) -> HostScan:
    return HostScan(
        hostname="gpuhost",
        proc_root=Path("/proc"),
        processes={p.pid: p for p in processes},
        gpu_processes=gpu,
        listeners=listeners,
    )


# kind (None: not recognised), then (host, port, how it is known) without a socket.
CASES = [
    # Ollama: `ollama serve` only; its address is OLLAMA_HOST as Ollama reads it.
    (["/usr/local/bin/ollama", "serve"], {}, "ollama", ("127.0.0.1", 11434, "the default")),
    (["/usr/local/bin/ollama", "serve"], {"OLLAMA_HOST": "0.0.0.0"}, "ollama",
     ("0.0.0.0", 11434, "OLLAMA_HOST in its environment")),
    (["ollama", "serve"], {"OLLAMA_HOST": "0.0.0.0:11500"}, "ollama",
     ("0.0.0.0", 11500, "OLLAMA_HOST in its environment")),
    (["ollama", "serve"], {"OLLAMA_HOST": ":11434"}, "ollama",
     ("0.0.0.0", 11434, "OLLAMA_HOST in its environment")),
    (["ollama", "serve"], {"OLLAMA_HOST": "http://10.0.0.5"}, "ollama",
     ("10.0.0.5", 80, "OLLAMA_HOST in its environment")),
    (["ollama", "serve"], {"OLLAMA_HOST": "[::]:11434"}, "ollama",
     ("::", 11434, "OLLAMA_HOST in its environment")),
    (["/usr/local/bin/ollama", "runner", "--model", "/blobs/sha256-x", "--port", "40123"], {},
     None, None),
    (["ollama", "run", "llama3.2"], {}, None, None),
    (["/usr/bin/python3", "-m", "gpugate_sim.ollama", "serve", "--host-file", "h.yaml"], {},
     "ollama", ("127.0.0.1", 11434, "the default")),
    # ComfyUI: main.py in a ComfyUI folder; --listen (bare: every address) and --port.
    (["/opt/ComfyUI/venv/bin/python", "/opt/ComfyUI/main.py", "--listen", "0.0.0.0", "--port",
      "8188"], {}, "comfyui", ("0.0.0.0", 8188, "--port on its command line")),
    (["python3", "main.py", "--listen", "--port", "8190"], {}, None, None),
    (["python", "-u", "/home/u/ComfyUI/main.py"], {}, "comfyui",
     ("127.0.0.1", 8188, "the default")),
    (["python3", "/srv/comfy/main.py", "--listen"], {}, "comfyui",
     ("0.0.0.0", 8188, "--listen on its command line")),
    (["python3", "ComfyUI/main.py", "--listen", "127.0.0.1,::1", "--port", "8189"], {}, "comfyui",
     ("127.0.0.1", 8189, "--port on its command line")),
    (["python3", "/srv/blog/main.py", "--port", "8188"], {}, None, None),
    # whisper.cpp's server.
    (["/usr/local/bin/whisper-server", "-m", "ggml-large-v3.bin", "--host", "0.0.0.0", "--port",
      "8080"], {}, "whisper", ("0.0.0.0", 8080, "--port on its command line")),
    (["whisper-server", "--port=9090"], {}, "whisper",
     ("127.0.0.1", 9090, "--port on its command line")),
    # llama.cpp's server: options, else LLAMA_ARG_HOST / LLAMA_ARG_PORT.
    (["/usr/local/bin/llama-server", "--models-dir", "/srv/gguf", "--port", "8091"], {}, "llama",
     ("127.0.0.1", 8091, "--port on its command line")),
    (["llama-server", "-m", "m.gguf"], {"LLAMA_ARG_HOST": "0.0.0.0", "LLAMA_ARG_PORT": "8099"},
     "llama", ("0.0.0.0", 8099, "LLAMA_ARG_PORT in its environment")),
    # vLLM: `vllm serve MODEL`, or its OpenAI server module.
    (["/usr/bin/vllm", "serve", "Qwen/Qwen2.5-7B-Instruct", "--port", "8001"], {}, "vllm",
     ("0.0.0.0", 8001, "--port on its command line")),
    (["python3", "-m", "vllm.entrypoints.openai.api_server", "--model", "m", "--host",
      "127.0.0.1"], {}, "vllm", ("127.0.0.1", 8000, "--host on its command line")),
    (["vllm", "bench", "serve"], {}, None, None),
    # External GPU users.
    (["/usr/lib/plexmediaserver/Plex Media Server"], {}, "plex", None),
    (["/usr/lib/plexmediaserver/Plex Transcoder", "-codec:0", "hevc"], {}, "plex", None),
    (["/app/Tdarr_Node/Tdarr_Node"], {}, "tdarr", None),
    (["node", "/app/Tdarr_Server/Tdarr_Server"], {}, "tdarr", None),
    # Neither.
    (["/usr/bin/ffmpeg", "-hwaccel", "cuda", "-i", "x.mkv"], {}, None, None),
    (["python3", "-c", "import ollama"], {}, None, None),
    (["python3", "/opt/mvoice/mvoice_server.py", "--port", "8765"], {}, None, None),
    ([], {}, None, None),
]  # fmt: skip


@pytest.mark.parametrize(("argv", "env", "kind", "address"), CASES)
def test_a_command_line_is_recognised_with_its_address(
    argv: list[str], env: dict[str, str], kind: str | None, address: tuple | None
) -> None:
    process = proc(argv, env, cwd="/srv" if "main.py" in argv else "/")
    hit = rule_for(process)
    assert (hit[0].kind if hit else None) == kind
    if kind is None:
        return
    (found,) = recognise(scan_of(process)).runtimes or recognise(scan_of(process)).external
    assert found.kind == kind
    assert (found.address is None) == (address is None)
    if address is not None:
        assert found.address == Address(*address)


def test_main_py_is_comfyui_when_its_folder_holds_comfyui_s_modules(tmp_path: Path) -> None:
    app = tmp_path / "srv" / "img"
    (app / "comfy").mkdir(parents=True)
    (app / "folder_paths.py").write_text("")
    assert rule_for(proc(["python3", "main.py"], cwd=str(app))) is not None
    other = tmp_path / "srv" / "blog"
    other.mkdir()
    assert rule_for(proc(["python3", "main.py"], cwd=str(other))) is None
    # A folder named for it is enough.
    assert rule_for(proc(["python3", "main.py"], cwd="/opt/comfy-ui")) is not None
    # An unreadable cwd cannot tell: not recognised.
    assert rule_for(proc(["python3", "main.py"], cwd=None)) is None


def test_a_listening_socket_is_where_it_listens_whatever_it_was_told() -> None:
    process = proc(["ollama", "serve"], {"OLLAMA_HOST": "127.0.0.1:11434"}, sockets=("501", "502"))
    listeners = (
        Listener("0.0.0.0", 11500, "501"),
        Listener("::", 11500, "502"),
        Listener("127.0.0.1", 11434, "999"),  # someone else's
    )
    (found,) = recognise(scan_of(process, listeners=listeners)).runtimes
    assert found.address == Address("0.0.0.0", 11500, "its listening socket")
    # Of several sockets, the one on the port it was told.
    comfy = proc(["python3", "/opt/ComfyUI/main.py", "--port", "8188"], sockets=("7", "8"))
    listeners = (Listener("127.0.0.1", 8100, "7"), Listener("127.0.0.1", 8188, "8"))
    (found,) = recognise(scan_of(comfy, listeners=listeners)).runtimes
    assert found.address == Address("127.0.0.1", 8188, "its listening socket")


def test_of_a_runtime_s_sockets_the_gate_takes_the_one_that_reaches_the_most_clients() -> None:
    process = proc(["ollama", "serve"], sockets=("1", "2", "3"))
    lan_and_loopback = (
        Listener("127.0.0.1", 11434, "1"),
        Listener("::1", 11434, "2"),
        Listener("192.168.1.5", 11434, "3"),
    )
    (found,) = recognise(scan_of(process, listeners=lan_and_loopback)).runtimes
    assert found.address == Address("192.168.1.5", 11434, "its listening socket")
    every = (*lan_and_loopback[:2], Listener("0.0.0.0", 11434, "3"))
    (found,) = recognise(scan_of(process, listeners=every)).runtimes
    assert found.address == Address("0.0.0.0", 11434, "its listening socket")


def test_a_socket_on_its_port_is_its_own_when_its_sockets_cannot_be_read() -> None:
    # Another user's Ollama without root: neither its environment nor its sockets are
    # readable, and it would be taken for one on loopback, its default.
    unreadable = attrs.evolve(proc(["ollama", "serve"]), env=None, fds_readable=False)
    table = (Listener("0.0.0.0", 11434, "77"), Listener("127.0.0.1", 9000, "78"))
    (found,) = recognise(scan_of(unreadable, listeners=table)).runtimes
    assert found.address == Address(
        "0.0.0.0", 11434, "a socket on its port (whose, init could not read)"
    )
    # Its sockets read, none on that port: the one there is another process's.
    readable = proc(["ollama", "serve"])
    (found,) = recognise(scan_of(readable, listeners=table)).runtimes
    assert found.address == Address("127.0.0.1", 11434, "the default")
    # In another network namespace, this namespace's table is not its.
    elsewhere = attrs.evolve(unreadable, namespaces=Namespaces(net=Sharing.OTHER))
    (found,) = recognise(scan_of(elsewhere, listeners=table)).runtimes
    assert found.address == Address("127.0.0.1", 11434, "the default")


def test_children_belong_to_their_outermost_recognised_ancestor() -> None:
    serve = proc(["/usr/local/bin/ollama", "serve"], pid=10)
    # Some Ollama builds name their runners llama-server: still Ollama's.
    runner = proc(
        ["/usr/lib/ollama/llama-server", "--model", "b", "--port", "40000"], pid=11, ppid=10
    )
    plex = proc(["/usr/lib/plexmediaserver/Plex Media Server"], pid=20)
    transcode = proc(["/usr/lib/plexmediaserver/Plex Transcoder", "-i", "x"], pid=21, ppid=20)
    shell = proc(["/bin/bash"], pid=30)
    stray = proc(["python3", "/opt/mvoice/mvoice_server.py"], pid=31, ppid=30)
    gpu = (
        GpuProcess(11, 0, 7796 * MiB),
        GpuProcess(21, 0, 1536 * MiB),
        GpuProcess(31, 0, 292 * MiB),
        GpuProcess(99, 0, None),  # in another PID namespace: not in this /proc
    )
    found = recognise(scan_of(serve, runner, plex, transcode, shell, stray, gpu=gpu))
    (ollama,) = found.runtimes
    assert ollama.process.pid == 10 and ollama.members == (10, 11)
    assert ollama.bytes_now == 7796 * MiB
    (external,) = found.external
    assert external.kind == "plex" and external.members == (20, 21)
    assert external.bytes_now == 1536 * MiB
    assert [(u.pid, u.used) for u in found.unknown] == [(31, 292 * MiB), (99, None)]
    assert found.unknown[1].command == "(not in /proc here)"


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("", ("127.0.0.1", 11434)),
        ("0.0.0.0", ("0.0.0.0", 11434)),
        ("127.0.0.1:11435", ("127.0.0.1", 11435)),
        (":8000", ("0.0.0.0", 8000)),
        ("https://gpu.lan", ("gpu.lan", 443)),
        ("http://gpu.lan:9000/ollama", ("gpu.lan", 9000)),
        ("[::1]:11434", ("::1", 11434)),
        ("::", ("::", 11434)),
        ("0.0.0.0:99999", ("0.0.0.0", 11434)),
    ],
)
def test_ollama_host_is_read_as_ollama_reads_it(value: str, expected: tuple[str, int]) -> None:
    assert parse_ollama_host(value) == expected


@pytest.mark.parametrize(
    ("argv", "name", "index"),
    [
        (["/usr/local/bin/ollama", "serve"], "ollama", 0),
        (["python3", "-u", "-X", "dev", "/opt/ComfyUI/main.py"], "main.py", 4),
        (["python3.11", "-m", "vllm.entrypoints.openai.api_server"], "api_server", 2),
        (["/usr/bin/node", "server.js"], "server.js", 1),
        (["python3", "-c", "print(1)"], None, None),
        (["python3"], None, None),
    ],
)
def test_the_program_is_found_through_an_interpreter(
    argv: list[str], name: str | None, index: int | None
) -> None:
    program = program_of(argv)
    assert (program.name if program else None) == name
    assert (program.index if program else None) == index


def test_options_take_the_last_value_in_either_spelling() -> None:
    args = ["--port", "1", "--port=2", "-m", "a.bin", "--listen"]
    assert option(args, ["--port"]) == "2"
    assert option(args, ["-m", "--model"]) == "a.bin"
    assert option(args, ["--listen"]) is None
    assert option(args, ["--listen"], flag_value="0.0.0.0") == "0.0.0.0"
    assert option(args, ["--host"]) is None
