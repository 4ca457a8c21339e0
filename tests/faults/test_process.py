"""Faults of the gate's own process: SIGKILL and restart, a locked database, SIGHUP with an
invalid configuration."""

from __future__ import annotations

import asyncio
import re
import signal
import sqlite3
import subprocess
import sys
import time
from datetime import datetime

import aiohttp
import pytest

from tests.faults.stack import assert_nothing_lost, eventually, post, stack

pytestmark = pytest.mark.e2e

TTL = 3.0


def generate(model: str, **extra: object) -> dict:
    return {"model": model, "prompt": "hi", "stream": False, **extra}


def over_policy(state: dict, ttl: float) -> list[dict]:
    """Runners of the simulated Ollama whose timer runs past now + ttl (+1 s of slack)."""
    now = time.time()
    late = []
    for runner in state["runners"]:
        at = runner["expires_at"]
        if at is None or datetime.fromisoformat(at).timestamp() > now + ttl + 1:
            late.append(runner)
    return late


async def test_sigkill_mid_workload_then_restart(tmp_path):
    preload = "- {model: bge-m3, keep_alive: 24h}\n"
    async with stack(tmp_path, host={"preload": preload}, gate={"ttl": f"{TTL:g}s"}) as s:
        body = {"model": "llama3.2:3b", "prompt": "x", "options": {"sim_tokens": 2000}}
        async with aiohttp.ClientSession() as session:
            streams = [await session.post(s.url + "/api/generate", json=body) for _ in range(3)]
            for resp in streams:
                assert resp.status == 200
                await resp.content.readline()
            s.gate.kill()
            for resp in streams:
                with pytest.raises(aiohttp.ClientPayloadError):
                    await resp.read()
        # The upstream requests of the dead gate are closed with its sockets.
        await eventually(
            s.host.sim_state, lambda st: st["counters"]["requests_in_flight"] == 0, timeout=5
        )
        await asyncio.to_thread(s.restart_gate)
        # The restarted gate folds in what Ollama holds from its first listing (how soon is
        # the benchmark's to measure; a busy machine must not fail it).
        await eventually(
            s.gate.status,
            lambda d: {r["model"] for r in d["residents"]} >= {"llama3.2:3b", "bge-m3:latest"},
            timeout=15,
        )
        # No model keeps a timer beyond the policy: not the 24 h preload, not the streams'.
        await eventually(s.host.sim_state, lambda st: not over_policy(st, TTL), timeout=3 * TTL)
        await assert_nothing_lost(s)


LEASES_WRITTEN = (
    "SELECT (SELECT count(*) FROM leases) + (SELECT coalesce(sum(leases), 0) FROM lease_minutes)"
)
"""Leases in the history: a row each, or counted in their minute's row."""

BUFFERED = re.compile(r"^gpugate_\w*(?:buffered|dropped)\w*(?:\{[^}]*\})? ([0-9.e+]+)$", re.M)


async def test_locked_database_buffers_events_and_admission_goes_on(tmp_path):
    configured = tmp_path / "gate.db"
    # In front of a simulated host the store lives beside its state, never where the
    # configuration names the real host's.
    database = tmp_path / "state" / "gpugate.db"
    async with stack(tmp_path, gate={"database": configured}) as s:
        assert (await post(s.url + "/api/generate", generate("llama3.2:3b")))[0] == 200
        assert database.exists() and not configured.exists()
        lock = sqlite3.connect(database, timeout=0, isolation_level=None)
        try:
            lock.execute("BEGIN EXCLUSIVE")
            before = lock.execute(LEASES_WRITTEN).fetchone()[0]
            started = time.monotonic()
            for model in ("gemma3:12b", "llama3.2:3b", "gemma3:12b"):
                status, _, body = await post(s.url + "/api/generate", generate(model), timeout=10)
                assert status == 200, body
            assert time.monotonic() - started < 8

            async def counted() -> list[str]:
                return BUFFERED.findall(await s.gate.metrics())

            await eventually(counted, lambda found: sum(map(float, found)) > 0, timeout=5)
        finally:
            lock.rollback() if lock.in_transaction else None
            lock.close()
        # Once the lock is gone what was buffered (each request's lease history) reaches
        # the file.
        reader = sqlite3.connect(database, timeout=5)
        try:

            async def written() -> int:
                return reader.execute(LEASES_WRITTEN).fetchone()[0]

            await eventually(written, lambda n: n >= before + 3, timeout=10)
        finally:
            reader.close()
        assert s.gate.alive()
        await assert_nothing_lost(s)


def check_message(config) -> str:
    """The error line `gpugate check FILE` prints for a file: FILE:LINE: path: message."""
    done = subprocess.run(
        [sys.executable, "-m", "gpugate", "check", str(config)],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode != 0
    lines = [
        line
        for line in (done.stderr + done.stdout).splitlines()
        if line.startswith(f"{config}:") and ": warning:" not in line
    ]
    assert lines, done
    return lines[0]


async def test_sighup_with_an_invalid_config_keeps_the_old_one(tmp_path):
    async with stack(tmp_path) as s:
        config = s.gate.config
        good = config.read_text()
        reserve = (await s.gate.status())["gpus"][0]["reserve"]
        config.write_text(good.replace("reserve: 1GiB", "reserve: lots", 1))
        expected = check_message(config)
        assert re.match(rf"^{re.escape(str(config))}:\d+: budget\.reserve: ", expected)
        s.gate.signal(signal.SIGHUP)
        # A log line ("level logger: message") whose message is check's line, unchanged.
        await asyncio.to_thread(s.gate.stderr.until, f"error gpugate.serve: {expected}", 10)
        assert s.gate.alive()
        assert (await s.gate.status())["gpus"][0]["reserve"] == reserve
        status, _, body = await post(s.url + "/api/generate", generate("llama3.2:3b"))
        assert status == 200, body
        await assert_nothing_lost(s)
