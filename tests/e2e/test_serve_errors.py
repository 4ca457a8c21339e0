"""`gpugate serve` refusing to start says why, in one line."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

from tests.ports import free_ports


def test_serve_says_which_port_it_cannot_take(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        control, upstream = free_ports(2)
        config = tmp_path / "consumers.yaml"
        config.write_text(
            f"gate:\n  control: 127.0.0.1:{control}\n"
            "consumers:\n  ollama:\n    runtime: ollama\n"
            f"    listen: 127.0.0.1:{port}\n    upstream: http://127.0.0.1:{upstream}\n"
            "    processes: {commands: [ollama serve]}\n"
        )
        result = subprocess.run(
            [sys.executable, "-m", "gpugate", "serve", "--config", str(config)],
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert result.returncode == 1
    assert (
        f"gpugate serve: cannot listen for ollama on http://127.0.0.1:{port}: "
        "Address already in use"
    ) in result.stderr


def test_serve_with_a_bad_config_exits_78_naming_the_line(tmp_path):
    config = tmp_path / "consumers.yaml"
    config.write_text("consumers:\n  ollama:\n    runtime: ollama\n    listen: nowhere\n")
    result = subprocess.run(
        [sys.executable, "-m", "gpugate", "serve", "--config", str(config)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 78
    assert f"{config}:4: consumers.ollama.listen: expected an address" in result.stderr


def test_serve_without_a_tokens_variable_exits_78_naming_it(tmp_path):
    control, listen, upstream = free_ports(3)
    config = tmp_path / "consumers.yaml"
    config.write_text(
        f"gate:\n  control: 127.0.0.1:{control}\n"
        "consumers:\n  ollama:\n    runtime: ollama\n"
        f"    listen: 127.0.0.1:{listen}\n    upstream: http://127.0.0.1:{upstream}\n"
        "    processes: {commands: [ollama serve]}\n"
        "identities:\n  - {name: ops, class: production, tokens: ['env:GPUGATE_OPS_TOKEN']}\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUGATE_")}
    result = subprocess.run(
        [sys.executable, "-m", "gpugate", "serve", "--config", str(config)],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert result.returncode == 78
    assert result.stderr.splitlines() == [
        f"gpugate serve: environment variable GPUGATE_OPS_TOKEN ({config}:10: "
        "identities[0].tokens[0]) is not set; set it or remove the token"
    ]
