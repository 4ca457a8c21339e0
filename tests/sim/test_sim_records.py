"""What the simulated runtimes record of the requests they acted on (HOST.yaml `record:`),
read back with the fuzzer's reader (tests/faults/records.py)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import aiohttp
import pytest

from gpugate.core.units import GiB
from gpugate_sim.scenario import ScenarioError, load_host
from gpugate_sim.whisper import SimWhisper
from gpugate_sim.whisper.process import whisper_argv
from gpugate_sim.whisper.transcript import wav_bytes
from tests.faults.records import (
    PromptRecord,
    WhisperRecord,
    WhisperRoute,
    read_prompt_records,
    read_whisper_records,
)
from tests.sim.comfyui_helpers import blank, make_comfy, session, txt2img
from tests.sim.test_sim_whisper import TURBO, TURBO_BYTES, card, spec
from tests.sim.test_sim_whisper_http import Connection, multipart

__all__ = ["make_comfy", "session"]


async def test_comfyui_records_each_post_prompt_before_answering(
    make_comfy, session: aiohttp.ClientSession, tmp_path: Path
):
    path = tmp_path / "records" / "prompts.jsonl"
    comfy = await make_comfy(record=path)
    url = comfy.url
    started = time.time()
    requests = [
        ("/prompt?case=ok-1", {"prompt": blank()}),
        ("/api/prompt?x=1&case=bad-2", {"prompt": txt2img(ckpt="nope.safetensors")}),
        ("/prompt", {"client_id": "no-prompt"}),
        ("/prompt?case=junk-4", b"{not json"),
    ]
    answers = []
    for target, body in requests:
        kwargs = {"data": body} if isinstance(body, bytes) else {"json": body}
        async with session.post(url + target, **kwargs) as resp:
            answer = await resp.json() if resp.status != 500 else None
            answers.append((resp.status, answer))
            # Written before the answer was sent: there as soon as the answer is here.
            assert len(read_prompt_records(path)) == len(answers)
    # The origin check refuses before the handler: nothing acted on, nothing recorded.
    headers = {"Origin": "http://evil.example"}
    async with session.post(f"{url}/prompt?case=cross-5", json={}, headers=headers) as resp:
        assert resp.status == 403
    records = read_prompt_records(path)
    assert [(r.case, r.status, r.queued, r.prompt_id) for r in records] == [
        ("ok-1", 200, True, answers[0][1]["prompt_id"]),
        ("bad-2", 400, False, None),
        ("", 400, False, None),
        ("junk-4", 500, False, None),
    ]
    times = [r.t for r in records]
    assert started <= times[0] and times == sorted(times) and times[-1] <= time.time()
    first = json.loads(path.read_text().splitlines()[0])
    assert list(first) == ["t", "case", "status", "queued", "prompt_id"]
    assert records[0] == PromptRecord(times[0], "ok-1", 200, True, answers[0][1]["prompt_id"])


def test_whisper_records_each_load_and_inference(tmp_path: Path) -> None:
    gpu = card(tmp_path)
    path = tmp_path / "whisper.jsonl"
    with SimWhisper(spec(record=path), gpu.directory) as sim:
        conn = Connection(sim.url or "")
        steps = [
            ("/load?case=l1", {"model": "m/ggml-base.en.bin"}, 200),
            # (A form with no part at all is refused before any handler: no record.)
            ("/load?case=l2", {"other": "x"}, 400),
            ("/load?case=l3", {"model": "models/missing.bin"}, 400),
            ("/inference?case=i1", {"file": wav_bytes(1)}, 200),
            ("/inference", {"response_format": "json"}, 400),
        ]
        for number, (target, fields, status) in enumerate(steps, start=1):
            assert conn.request("POST", target, multipart(fields))[0] == status  # type: ignore[arg-type]
            assert len(read_whisper_records(path)) == number
        # Neither a GET nor another route is recorded.
        assert conn.request("GET", "/health?case=h")[0] == 404  # still "loading" after l3
        assert conn.request("POST", "/load", multipart({"model": TURBO}))[0] == 200
    records = read_whisper_records(path)
    assert [(r.case, r.status, r.route, r.model, r.loaded) for r in records] == [
        ("l1", 200, WhisperRoute.LOAD, "m/ggml-base.en.bin", True),
        ("l2", 400, WhisperRoute.LOAD, None, False),
        ("l3", 400, WhisperRoute.LOAD, "models/missing.bin", False),
        ("i1", 200, WhisperRoute.INFERENCE, None, False),
        ("", 400, WhisperRoute.INFERENCE, None, False),
        ("", 200, WhisperRoute.LOAD, TURBO, True),
    ]
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert list(lines[0]) == ["t", "case", "status", "model", "loaded"]
    assert list(lines[3]) == ["t", "case", "status"]
    assert [r.t for r in records] == sorted(r.t for r in records)


def test_whisper_records_a_load_it_exits_on(tmp_path: Path) -> None:
    gpu = card(tmp_path, total=3 * GiB)
    path = tmp_path / "whisper.jsonl"
    models = {TURBO: TURBO_BYTES, "huge.bin": 4 * GiB}
    with SimWhisper(spec(models=models, record=path), gpu.directory) as sim:
        conn = Connection(sim.url or "")
        conn.send("POST", "/load?case=big", multipart({"model": "huge.bin"}))
        assert conn.closed_by_server()
        assert sim.wait(timeout=20) == 1
    (record,) = read_whisper_records(path)
    assert record == WhisperRecord(record.t, "big", None, WhisperRoute.LOAD, "huge.bin", False)


def test_host_file_record_paths(tmp_path: Path) -> None:
    host_file = tmp_path / "hosts" / "host.yaml"
    host_file.parent.mkdir()
    elsewhere = tmp_path / "w.jsonl"
    host_file.write_text(
        "comfyui:\n  record: out/prompts.jsonl\n"
        f"whisper:\n  record: {elsewhere}\n  models: {{{TURBO}: 2GiB}}\n  model: {TURBO}\n"
    )
    host = load_host(host_file)
    assert host.comfyui is not None and host.whisper is not None
    # Relative to the host file, whichever directory its processes start in.
    assert host.comfyui.record == tmp_path / "hosts" / "out" / "prompts.jsonl"
    assert host.whisper.record == elsewhere
    argv = whisper_argv(host.whisper)
    assert argv[argv.index("--sim-record") + 1] == str(elsewhere)
    assert "--sim-record" not in whisper_argv(spec())
    for section in ("comfyui", "whisper"):
        host_file.write_text(f"{section}:\n  record: 5\n")
        with pytest.raises(ScenarioError, match=rf"{section}\.record: expected a file path"):
            load_host(host_file)
