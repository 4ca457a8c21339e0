"""Every command's exit code is the sysexits code for what happened (gpugate.commands.exits), the
same from one command to the next: each command runs as its own process, as a unit's
ExecStartPre or a script runs it, against a running gate or where none answers."""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

import aiohttp
import pytest

from gpugate.commands.exits import Exit, for_answer
from gpugate.config.paths import DEFAULT_CONFIG_PATHS
from gpugate.core.failures import FailureClass
from tests.control.conftest import CONTROL_TOKEN, admin
from tests.ports import free_port


@pytest.fixture(autouse=True)
def no_token_of_this_user(tmp_path, monkeypatch):
    """Neither a unit's credential nor this user's local token (`gpugate demo` writes one)
    stands in for the token a test gives or withholds."""
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path / "run"))
    monkeypatch.delenv("CREDENTIALS_DIRECTORY", raising=False)


def environment(token: str | None = CONTROL_TOKEN, **extra: str) -> dict[str, str]:
    """This process's environment without any GPUGATE_ setting but those given."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUGATE_")}
    if token is not None:
        env["GPUGATE_TOKEN"] = token
    return {**env, "PYTHONUNBUFFERED": "1", **extra}


async def gpugate(
    *args: str, env: dict[str, str] | None = None, cwd: Path | None = None
) -> tuple[int, str, str]:
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "gpugate", *args,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        env=environment() if env is None else env, cwd=cwd,
    )  # fmt: skip
    out, err = await asyncio.wait_for(process.communicate(), 60)
    assert process.returncode is not None
    return process.returncode, out.decode(), err.decode()


def config_for(tmp_path: Path, control_url: str, name: str = "cli.yaml") -> str:
    config = tmp_path / name
    config.write_text(f"gate:\n  control: {control_url.removeprefix('http://')}\n")
    return str(config)


@pytest.fixture
def cli(stack, tmp_path):
    """`gpugate ARGS --config FILE` against the running gate, with its control token."""
    config = config_for(tmp_path, stack.control_url)

    async def run(*args: str, env: dict[str, str] | None = None) -> tuple[int, str, str]:
        if "--" in args:
            at = args.index("--")
            args = (*args[:at], "--config", config, *args[at:])
        else:
            args = (*args, "--config", config)
        return await gpugate(*args, env=env)

    return run


LEASE = ("lease", "--consumer", "ollama", "--bytes", "1GiB")


# -- refusals that retrying cannot change ---------------------------------------------


@pytest.mark.parametrize(
    "command",
    [
        [*LEASE, "--", "true"],
        ["admit", "ollama"],
        ["drain", "ollama"],
        ["pause"],
        ["evict", "ollama", "gemma3:12b"],
    ],
    ids=lambda command: command[0],
)
async def test_a_token_the_gate_refuses_is_77_for_every_command(cli, command):
    code, out, err = await cli(*command, env=environment(token="not-the-token"))
    assert (code, out) == (Exit.NOPERM, "")
    assert err == f"gpugate {command[0]}: UNAUTHORIZED: the bearer token is not valid here\n"


async def test_no_token_at_all_is_77_too(cli):
    code, _, err = await cli(*LEASE, "--", "true", env=environment(token=None))
    assert code == Exit.NOPERM
    assert "UNAUTHORIZED: this route needs a bearer token" in err


@pytest.mark.parametrize(
    ("option", "value", "named"),
    [
        ("--bytes", "lots", "--bytes: expected a size"),
        ("--bytes", "0", "--bytes: a lease must be for more than 0 bytes"),
        ("--class", "urgent", "--class: unknown priority class 'urgent'"),
        ("--ttl", "soon", "--ttl: "),
        ("--wait", "forever", "--wait: "),
    ],
)
async def test_a_value_that_does_not_parse_is_64_and_nothing_is_asked(
    stack, cli, option, value, named
):
    args = ["lease", "--consumer", "ollama", "--bytes", "1GiB", option, value, "--", "true"]
    if option == "--bytes":
        args = ["lease", "--consumer", "ollama", option, value, "--", "true"]
    code, _, err = await cli(*args)
    assert code == Exit.USAGE, err
    assert err.startswith(f"gpugate lease: {named}") and err.count("\n") == 1
    assert stack.gate.leases.explicit_leases() == []


async def test_an_unknown_consumer_is_65_for_lease_admit_and_drain(cli):
    code, _, err = await cli("lease", "--consumer", "nobody", "--bytes", "1GiB", "--", "true")
    assert code == Exit.DATAERR
    assert err.startswith("gpugate lease: BAD_REQUEST: consumer: no consumer 'nobody'")
    code, _, err = await cli("admit", "nobody")
    assert code == Exit.DATAERR
    assert err.startswith("gpugate admit: BAD_REQUEST: consumer: no consumer 'nobody'")
    code, _, err = await cli("drain", "nobody")
    assert (code, err) == (Exit.DATAERR, "gpugate drain: NOT_FOUND: no consumer 'nobody'\n")


async def test_an_unknown_identity_resident_or_gpu_is_65(cli):
    code, _, err = await cli("lease", "--identity", "nobody", "--bytes", "1GiB", "--", "true")
    assert code == Exit.DATAERR
    assert "identity: no identity 'nobody'" in err
    code, _, err = await cli("evict", "ollama", "nosuch:latest")
    assert code == Exit.DATAERR and err.startswith("gpugate evict: NOT_FOUND: ")
    code, _, err = await cli("pause", "--gpu", "7")
    assert (code, err) == (Exit.DATAERR, "gpugate pause: NOT_FOUND: no GPU 7\n")


async def test_more_bytes_than_the_card_has_is_65_not_a_wait(stack, cli):
    code, _, err = await cli("lease", "--consumer", "ollama", "--bytes", "20GiB", "--", "true")
    assert code == Exit.DATAERR
    assert err.startswith("gpugate lease: BAD_REQUEST: bytes: 21474836480 is more than GPU 0 has")
    assert stack.gate.leases.explicit_leases() == []


async def test_a_ttl_past_the_gate_s_maximum_is_65_and_nothing_runs(stack, cli, tmp_path):
    ran = tmp_path / "ran"
    code, _, err = await cli(*LEASE, "--ttl", "2h", "--", "touch", str(ran))
    assert code == Exit.DATAERR
    assert err.startswith("gpugate lease: BAD_REQUEST: ttl: at most 1h (gate.max_lease_ttl), ")
    assert not ran.exists() and stack.gate.leases.explicit_leases() == []


async def test_admit_for_a_consumer_with_no_envelope_is_65(cli):
    # The ollama consumer sizes each model; it has no envelope of its own to admit.
    code, _, err = await cli("admit", "ollama")
    assert code == Exit.DATAERR
    assert err == (
        "gpugate admit: BAD_REQUEST: bytes: consumer 'ollama' has no envelope to admit a "
        "start for\n"
    )


def test_evict_s_two_409s_differ_by_whether_force_or_time_changes_them():
    # The two 409s of `evict`: one that --force changes, one that time changes.
    assert for_answer(409, "EVICTION_NOT_ALLOWED") is Exit.DATAERR
    assert for_answer(409, "RESIDENCY_CONFLICT") is Exit.TEMPFAIL
    assert for_answer(409, "LEASE_CONFLICT") is Exit.DATAERR
    assert for_answer(403, None) is Exit.NOPERM
    assert for_answer(501, "CAPABILITY_UNAVAILABLE") is Exit.UNAVAILABLE


# -- the command line and the configuration --------------------------------------------


@pytest.mark.parametrize(
    "args",
    [
        [],
        ["frobnicate"],
        ["lease", "--bytes", "1GiB", "--", "true"],
        ["lease", "--consumer", "a", "--identity", "b", "--bytes", "1GiB", "--", "true"],
        ["admit"],
        ["pause", "--gpu", "first"],
        ["events", "--last", "many"],
    ],
    ids=lambda args: " ".join(args) or "nothing",
)
async def test_a_command_line_argparse_refuses_is_64_not_2(args):
    code, out, err = await gpugate(*args)
    assert (code, out) == (Exit.USAGE, "")
    assert err.startswith("usage: gpugate") and "error: " in err


async def test_lease_without_a_command_is_64(cli):
    code, _, err = await cli(*LEASE)
    assert (code, err) == (Exit.USAGE, "gpugate lease: give the command to run after --\n")


async def test_an_events_filter_that_names_no_class_is_64(cli):
    code, _, err = await cli("events", "--class", "urgent")
    assert code == Exit.USAGE and err.startswith("gpugate events: --class: unknown priority")
    code, _, err = await cli("events", "--failure", "GPU_OMM")
    assert code == Exit.USAGE and err.startswith("gpugate events: --failure: unknown failure")
    code, _, err = await cli("events", "--failure", "any", "--class", "Background")
    assert (code, err) == (0, "")


GATE_COMMANDS = [
    ["leases"],
    ["events"],
    ["envelopes"],
    ["status", "--watch"],
    [*LEASE, "--", "true"],
    ["admit", "whisper"],
    ["drain", "ollama"],
    ["pause"],
]
"""A command of each kind that needs the gate: a view, lease, admit, an operator action."""


@pytest.mark.parametrize(
    # `status --watch` asks the default control address without one (docs/configuration.md).
    "command",
    [command for command in GATE_COMMANDS if command[0] != "status"],
    ids=lambda command: command[0],
)
async def test_no_configuration_file_is_78_naming_every_place_looked_in(tmp_path, command):
    if any(path.is_absolute() and path.exists() for path in DEFAULT_CONFIG_PATHS):
        pytest.skip("this machine has a system-wide configuration file")
    code, out, err = await gpugate(*command, env=environment(), cwd=tmp_path)
    assert (code, out) == (Exit.CONFIG, "")
    assert err == (
        f"gpugate {command[0]}: no configuration file: $GPUGATE_CONFIG is not set and none "
        f"of {tmp_path / 'consumers.yaml'}, /etc/gpugate/consumers.yaml exists; "
        "give --config FILE\n"
    )


async def test_a_gpugate_config_naming_a_missing_file_is_78_naming_it(tmp_path):
    missing = tmp_path / "gone.yaml"
    code, _, err = await gpugate("leases", env=environment(GPUGATE_CONFIG=str(missing)))
    assert (code, err) == (Exit.CONFIG, f"gpugate leases: $GPUGATE_CONFIG names {missing}, "
                                        "which does not exist\n")  # fmt: skip


async def test_a_configuration_that_does_not_load_is_78(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("budget:\n  reserve: lots\n")
    for command in (["leases"], [*LEASE], ["admit", "whisper"], ["drain", "x"], ["status"]):
        args = [*command, "--config", str(bad)]
        if command[0] == "lease":
            args += ["--", "true"]
        code, _, err = await gpugate(*args)
        assert code == Exit.CONFIG, command
        assert "bad.yaml:2: budget.reserve: expected a size" in err


# -- no gate ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "command",
    [*GATE_COMMANDS, ["events", "--follow"], ["evict", "ollama", "gemma3:12b"]],
    ids=lambda command: " ".join(command[:2]),
)
async def test_no_gate_answering_is_69_naming_the_address(tmp_path, command):
    port = free_port()
    config = config_for(tmp_path, f"http://127.0.0.1:{port}")
    args = [*command, "--config", config]
    if "--" in command:
        at = command.index("--")
        args = [*command[:at], "--config", config, *command[at:]]
    code, out, err = await gpugate(*args)
    assert (code, out) == (Exit.UNAVAILABLE, "")
    assert err == (
        f"gpugate {command[0]}: no gate answers at http://127.0.0.1:{port} (Connection refused)\n"
    )


async def test_status_with_no_gate_and_no_nvml_says_no_gate_answers_and_is_69(tmp_path):
    port = free_port()
    config = config_for(tmp_path, f"http://127.0.0.1:{port}")
    env = environment(GPUGATE_NVML_LIBRARY=str(tmp_path / "missing" / "libnvidia-ml.so.1"))
    env.pop("LD_LIBRARY_PATH", None)
    code, out, err = await gpugate("status", "--config", config, env=env)
    assert (code, out) == (Exit.UNAVAILABLE, "")
    assert err.startswith(
        f"gpugate status: no gate answers at http://127.0.0.1:{port} (Connection refused), "
        "and NVML cannot be read here: DRIVER_ERROR: NVML "
    )
    assert err.count("\n") == 1


async def test_status_with_no_gate_but_nvml_is_0(tmp_path, subprocess_env):
    config = config_for(tmp_path, f"http://127.0.0.1:{free_port()}")
    env = {k: v for k, v in subprocess_env.items() if k != "GPUGATE_TOKEN"}
    code, out, err = await gpugate("status", "--config", config, env=env)
    assert (code, err) == (0, "")
    assert out.startswith("no gate running: sampled NVML directly")


async def test_something_else_at_the_control_address_is_69(tmp_path):
    async def teapot(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nConnection: close\r\n\r\nhello")
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(teapot, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    config = config_for(tmp_path, f"http://127.0.0.1:{port}")
    async with server:
        code, _, err = await gpugate("admit", "whisper", "--config", config)
    assert code == Exit.UNAVAILABLE
    assert err == (
        f"gpugate admit: what answers at http://127.0.0.1:{port} is not a gpugate control "
        "listener (HTTP 200, not JSON)\n"
    )


# -- the one code a retry can change ---------------------------------------------------


async def test_no_room_within_the_wait_is_75_and_the_same_command_succeeds_later(stack, cli):
    async with (
        aiohttp.ClientSession() as session,
        session.post(
            stack.control_url + "/gate/v1/leases",
            json={"consumer": "ollama", "bytes": "13GiB", "ttl": "60s"},
            headers=admin(),
        ) as resp,
    ):
        assert resp.status == 201, await resp.text()
    code, out, err = await cli(*LEASE[:-1], "4GiB", "--wait", "0s", "--", "echo", "ran")
    assert (code, out) == (Exit.TEMPFAIL, "")
    # Not more than the card, only more than is free while the other lease is held: which
    # capacity class says so depends on what the planner sees first, each a 503.
    failure = err.removeprefix("gpugate lease: ").split(":")[0]
    assert FailureClass(failure).http_status == 503, err
    assert err.count("\n") == 1
    (held,) = stack.gate.leases.explicit_leases()
    stack.gate.leases.release(held)
    code, out, err = await cli(*LEASE[:-1], "4GiB", "--wait", "0s", "--", "echo", "ran")
    assert (code, out, err) == (0, "ran\n", "")


async def test_a_draining_consumer_is_75_until_undrained(cli):
    assert (await cli("drain", "ollama"))[0] == 0
    code, _, err = await cli(*LEASE, "--", "true")
    assert code == Exit.TEMPFAIL
    assert err.startswith("gpugate lease: RESIDENCY_CONFLICT: ")
    assert (await cli("undrain", "ollama"))[0] == 0
    assert (await cli(*LEASE, "--", "true"))[0] == 0


# -- once the command ran, its code is the command's ------------------------------------


@pytest.mark.parametrize("status", [0, 3, Exit.TEMPFAIL, Exit.NOPERM])
async def test_lease_exits_with_the_command_s_own_code(cli, status):
    code, _, err = await cli(*LEASE, "--", sys.executable, "-c", f"raise SystemExit({status})")
    assert (code, err) == (status, "")


async def test_lease_of_a_command_that_cannot_run_is_127(cli, tmp_path):
    code, _, err = await cli(*LEASE, "--", str(tmp_path / "no-such-program"))
    assert code == 127
    assert err.startswith("gpugate lease: cannot run ")
