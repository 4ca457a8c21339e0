"""The local token of a gate (gpugate.commands.local_token): one per control port, held by the demo
that wrote it, removed only by it, and what a command finds for a gate on loopback."""

from __future__ import annotations

import stat

import pytest

from gpugate.commands.control_client import control_endpoint
from gpugate.commands.local_token import (
    TokenInUse,
    local_token_path,
    read_local_token,
    remove_local_token,
    write_local_token,
)
from gpugate.runtimes.sections import load_config_text


@pytest.fixture(autouse=True)
def runtime_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path / "run"))
    monkeypatch.delenv("CREDENTIALS_DIRECTORY", raising=False)
    monkeypatch.delenv("GPUGATE_TOKEN", raising=False)
    return tmp_path / "run" / "gpugate"


def test_each_control_port_has_its_own_token(runtime_dir):
    first, second = write_local_token(9411), write_local_token(40008)
    try:
        assert (first.path, second.path) == (
            runtime_dir / "control-9411.token",
            runtime_dir / "control-40008.token",
        )
        assert stat.S_IMODE(runtime_dir.stat().st_mode) == 0o700
        assert stat.S_IMODE(first.path.stat().st_mode) == 0o600
        assert read_local_token(9411) != read_local_token(40008)
        assert len(read_local_token(9411) or "") == 64
        remove_local_token(first)
        assert read_local_token(9411) is None
        assert read_local_token(40008) == second.path.read_text().strip()
    finally:
        remove_local_token(second)
    assert list(runtime_dir.iterdir()) == []


def test_a_port_whose_token_a_running_demo_holds_is_not_written_again():
    held = write_local_token(9411)
    token = read_local_token(9411)
    try:
        with pytest.raises(TokenInUse, match=r"control-9411\.token is held by another running"):
            write_local_token(9411)
        assert read_local_token(9411) == token
    finally:
        remove_local_token(held)


def test_a_token_left_by_a_killed_demo_is_taken_over(runtime_dir):
    runtime_dir.mkdir(mode=0o700, parents=True)
    local_token_path(9411).write_text("left-behind\n")
    local_token_path(9411).chmod(0o644)
    token = write_local_token(9411)
    try:
        assert read_local_token(9411) not in (None, "left-behind")
        assert stat.S_IMODE(token.path.stat().st_mode) == 0o600
    finally:
        remove_local_token(token)


def test_a_demo_removes_only_the_file_it_still_holds():
    token = write_local_token(9411)
    # Someone removed it and another token was written since: it is not this demo's.
    token.path.unlink()
    token.path.write_text("another's\n")
    remove_local_token(token)
    assert read_local_token(9411) == "another's"


def test_a_command_presents_the_token_of_its_gate_s_port(tmp_path):
    first, second = write_local_token(9411), write_local_token(40008)
    try:
        for token in (first, second):
            port = token.path.name.removeprefix("control-").removesuffix(".token")
            config = load_config_text(f"gate:\n  control: 127.0.0.1:{port}\n", tmp_path / "c.yaml")
            assert control_endpoint(config) == (
                f"http://127.0.0.1:{port}",
                token.path.read_text().strip(),
            )
        # Not on loopback: no local token is presented.
        config = load_config_text("gate:\n  control: 10.0.0.5:9411\n", tmp_path / "c.yaml")
        assert control_endpoint(config) == ("http://10.0.0.5:9411", None)
    finally:
        remove_local_token(first)
        remove_local_token(second)
