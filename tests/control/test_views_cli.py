"""`gpugate leases`, `events [--follow]`, `envelopes` and `status --watch` against a
running gate, each as its own process (as a person runs them)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys

import aiohttp
import ollama

from gpugate.commands.exits import Exit
from gpugate.commands.views import EVENT_HEADERS, event_columns, event_row
from gpugate.core.failures import Failure, FailureClass
from gpugate.core.units import GiB, MiB
from gpugate.store.db import MeasuredEnvelope
from tests.control.conftest import admin


async def gpugate(stack, tmp_path, *args: str) -> tuple[int, str, str]:
    process = await cli(stack, tmp_path, *args)
    out, err = await asyncio.wait_for(process.communicate(), 60)
    return process.returncode, out.decode(), err.decode()


async def cli(stack, tmp_path, *args: str) -> asyncio.subprocess.Process:
    config = tmp_path / "cli.yaml"
    port = stack.control_url.rsplit(":", 1)[1]
    config.write_text(f"gate:\n  control: 127.0.0.1:{port}\n")
    return await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "gpugate",
        *args,
        "--config",
        str(config),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )


async def test_leases_lists_requests_and_explicit_leases(stack, tmp_path):
    async with (
        aiohttp.ClientSession() as session,
        session.post(
            stack.control_url + "/gate/v1/leases",
            json={"consumer": "ollama", "bytes": "2GiB", "ttl": "60s"},
            headers=admin(),
        ) as resp,
    ):
        lease = await resp.json()
        assert resp.status == 201, lease
    code, out, err = await gpugate(stack, tmp_path, "leases", "--json")
    assert code == 0, err
    document = json.loads(out)
    assert document["queue"] == []
    (row,) = document["leases"]
    assert (row["id"], row["explicit"], row["bytes"]) == (lease["id"], True, 2 * GiB)
    assert row["scope"] == "explicit"
    assert 0 < row["expires_in"] <= 60
    code, out, _ = await gpugate(stack, tmp_path, "leases")
    assert code == 0
    header, line = out.splitlines()
    assert header.split() == ["ID", "CONSUMER", "MODEL", "GPU", "CLASS", "SCOPE", "LOADING",
                              "WAITED", "EXPIRES"]  # fmt: skip
    assert line.split()[:6] == [
        str(lease["id"]), "ollama", "(explicit)", "0", "interactive", "explicit"
    ]  # fmt: skip
    stack.gate.leases.release(stack.gate.leases.explicit_leases()[0])
    code, out, _ = await gpugate(stack, tmp_path, "leases")
    assert (code, out) == (0, "no lease in flight\n")


async def test_events_filter_by_consumer_class_and_failure(stack, tmp_path):
    await ollama.AsyncClient(host=stack.gate_url).generate("llama3.2:3b", "hi")
    stack.gate.report(Failure(FailureClass.TIMEOUT, "TIMEOUT: upstream silent", consumer="ollama"))
    code, out, err = await gpugate(stack, tmp_path, "events", "--json", "--class", "interactive")
    assert code == 0, err
    events = [json.loads(line) for line in out.splitlines()]
    # Lease events carry the request's class (a release names no class).
    assert [e["event"] for e in events] == ["lease_granted"]
    assert all(e["priority"] == "interactive" and e["time"] > 0 for e in events)
    code, out, _ = await gpugate(stack, tmp_path, "events", "--failure", "any")
    header, line = out.splitlines()
    assert header.split() == ["TIME", "EVENT", "CONSUMER", "MODEL", "CLASS", "DETAIL"]
    assert "FAILURE TIMEOUT" in line and "upstream silent" in line
    code, out, _ = await gpugate(stack, tmp_path, "events", "--consumer", "nobody")
    assert (code, out) == (0, "no event\n")


async def test_events_follow_prints_each_event_as_it_happens(stack, tmp_path):
    process = await cli(stack, tmp_path, "events", "--follow", "--failure", "GPU_OOM")
    assert process.stdout is not None
    try:
        header = await asyncio.wait_for(process.stdout.readline(), 30)
        assert header.decode().split()[:2] == ["TIME", "EVENT"]
        # The header is printed once the gate registered the stream: what follows is live.
        stack.gate.report(Failure(FailureClass.TIMEOUT, "TIMEOUT: not this one"))
        stack.gate.report(Failure(FailureClass.GPU_OOM, "GPU_OOM: out of memory", gpu=0))
        line = (await asyncio.wait_for(process.stdout.readline(), 30)).decode()
        assert "FAILURE GPU_OOM" in line and "out of memory" in line
        assert cells_start_under_headers(header.decode(), line)
    finally:
        process.send_signal(signal.SIGINT)
        await asyncio.wait_for(process.wait(), 30)


def cells_start_under_headers(header: str, line: str) -> bool:
    """Whether every cell of `line` starts where its column's header starts (an empty
    DETAIL, the last column, is no cell)."""
    starts = [header.index(name) for name in EVENT_HEADERS]
    if len(line.rstrip("\n")) <= starts[-1]:
        starts.pop()
    return all(
        line[start] != " " and (start == 0 or line[start - 2 : start] == "  ") for start in starts
    )


def test_a_followed_event_table_keeps_its_columns_from_row_to_row():
    columns = event_columns(["ollama", "whisper", "identity:trainer"])
    header = columns.line(EVENT_HEADERS)
    rows = [
        columns.line(event_row(event))
        for event in (
            {"time": 1.0, "event": "lease_granted", "consumer": "ollama", "model": "gemma3:12b",
             "priority": "interactive", "bytes": 7796 * MiB},
            {"time": 2.0, "event": "out_of_band_resident", "consumer": "identity:trainer"},
            {"time": 3.0, "event": "failure", "failure": "INSUFFICIENT_SCHEDULABLE_VRAM",
             "consumer": "whisper", "priority": "maintenance", "message": "no room"},
        )
    ]  # fmt: skip
    assert all(cells_start_under_headers(header, row) for row in rows), [header, *rows]
    # A model name longer than any before widens its column from that row on, never back.
    long = columns.line(event_row({"time": 4.0, "event": "x", "model": "m" * 40}))
    after = columns.line(event_row({"time": 5.0, "event": "x", "model": "short"}))
    # The CLASS cell ("-") is each row's last: it moved right once, and stays there.
    assert long.rindex("-") == after.rindex("-") > header.index("CLASS")


async def test_envelopes_show_when_and_an_unknown_runtime_version_as_a_dash(stack, tmp_path):
    store = stack.gate.store
    store.record_envelope(MeasuredEnvelope("ollama", "bge-m3:latest", "", 2012 * MiB))
    qwen = MeasuredEnvelope(
        "ollama", "qwen2.5:7b", "num_ctx=8192", 5 * GiB, runtime_version="0.33.0"
    )
    store.record_envelope(qwen)
    await store.flush()
    code, out, err = await gpugate(stack, tmp_path, "envelopes")
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0].split() == ["CONSUMER", "MODEL", "OPTIONS", "BYTES", "MEASURED", "RUNTIME"]
    bge = next(x for x in lines if "bge-m3" in x).split()
    assert bge[-1] == "-" and "1.96" in bge
    qwen = next(x for x in lines if "qwen2.5" in x).split()
    assert qwen[-1] == "0.33.0" and "num_ctx=8192" in qwen
    code, out, _ = await gpugate(stack, tmp_path, "envelopes", "--json")
    rows = {r["model"]: r for r in json.loads(out)}
    assert rows["bge-m3:latest"]["runtime_version"] is None


async def test_status_watch_redraws_until_interrupted(stack, tmp_path):
    process = await cli(stack, tmp_path, "status", "--watch")
    assert process.stdout is not None
    try:
        seen = b""
        async with asyncio.timeout(30):
            while seen.count(b"\x1b[2J") < 2:
                seen += await process.stdout.read(4096)
        assert b"schedulable" in seen and b"GPU 0" in seen
    finally:
        process.send_signal(signal.SIGINT)
        code = await asyncio.wait_for(process.wait(), 30)
    assert code in (0, 130)


async def test_a_gate_that_does_not_answer_is_one_line_and_a_failure(stack, tmp_path):
    config = tmp_path / "nowhere.yaml"
    config.write_text("gate:\n  control: 127.0.0.1:1\n")
    for command in (["leases"], ["events"], ["envelopes"], ["status", "--watch"]):
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "gpugate", *command, "--config", str(config),
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        out, err = await asyncio.wait_for(process.communicate(), 60)
        assert process.returncode == Exit.UNAVAILABLE, command
        assert out == b"" and len(err.decode().splitlines()) == 1
        assert "no gate answers at http://127.0.0.1:1" in err.decode()
