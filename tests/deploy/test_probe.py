"""The DaemonSet's probe script, run as kubelet runs it: against a real gate whose control
listener wants the `read` scope (the shipped token configuration), and against health
answers that only part of the gate is unwell."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import attrs
from aiohttp import web

from gpugate.runtimes.sections import load_config_text
from tests.deploy.manifests import configmap_text
from tests.deploy.test_manifests import probe_script
from tests.gate.harness import running_stack

READ_TOKEN = "read-token-for-the-probe"


def _script(url: str, token_file: Path) -> str:
    script = probe_script()
    script = script.replace('"http://127.0.0.1:9411/gate/v1/health"', json.dumps(url))
    return script.replace('"/etc/gpugate/tokens/read.token"', json.dumps(str(token_file)))


async def _probe(script: str, mode: str) -> tuple[int, str]:
    # Asynchronously: the gate under test answers in this same event loop.
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        script,
        mode,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    _, err = await asyncio.wait_for(process.communicate(), 30)
    assert process.returncode is not None
    return process.returncode, err.decode()


async def test_the_probes_pass_on_a_gate_with_the_shipped_token_configuration(
    tmp_path, sim_host, fakenvml_path
):
    tokens = tmp_path / "tokens"
    tokens.mkdir()
    for name in ("control.token", "batch.token"):
        (tokens / name).write_text(f"{name}-value\n")
    (tokens / "read.token").write_text(READ_TOKEN + "\n")
    shipped = load_config_text(
        configmap_text().replace("file:/etc/gpugate/tokens/", f"file:{tokens}/"),
        tmp_path / "shipped.yaml",
    )
    async with running_stack(tmp_path, sim_host, fakenvml_path) as stack:
        gate = stack.gate
        gate.config = attrs.evolve(
            gate.config,
            gate=attrs.evolve(
                gate.config.gate,
                control_public=False,
                control_tokens=shipped.gate.control_tokens,
            ),
        )
        url = stack.control_url + "/gate/v1/health"
        script = _script(url, tokens / "read.token")
        assert await _probe(script, "live") == (0, "")
        assert await _probe(script, "ready") == (0, "")

        # A token the gate does not know: 401, and both probes fail.
        wrong = tmp_path / "wrong.token"
        wrong.write_text("not-a-token\n")
        code, err = await _probe(_script(url, wrong), "live")
        assert code == 1 and "HTTP 401" in err
        code, err = await _probe(_script(url, wrong), "ready")
        assert code == 1 and "HTTP 401" in err

    # No gate at all: refused, both fail.
    for mode in ("live", "ready"):
        code, err = await _probe(script, mode)
        assert code == 1 and "Connection refused" in err, err


def _health(*failed: str) -> dict:
    checks = [
        {"check": "started", "ok": "started" not in failed},
        {"check": "nvml", "gpu": 0, "ok": "nvml" not in failed},
        {"check": "listing", "consumer": "ollama", "ok": "listing" not in failed},
        {"check": "health_route", "consumer": "comfyui", "ok": "health_route" not in failed},
    ]
    return {"ok": not failed, "failed": list(failed), "checks": checks}


async def test_a_runtime_that_is_down_unreadies_nothing_and_stale_nvml_unreadies_the_gate(
    tmp_path,
):
    answers: list[dict] = []

    async def health(request: web.Request) -> web.Response:
        assert request.headers["Authorization"] == f"Bearer {READ_TOKEN}"
        document = answers[-1]
        return web.json_response(document, status=200 if document["ok"] else 503)

    app = web.Application()
    app.router.add_get("/gate/v1/health", health)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        port = runner.addresses[0][1]
        token = tmp_path / "read.token"
        token.write_text(READ_TOKEN + "\n")
        script = _script(f"http://127.0.0.1:{port}/gate/v1/health", token)

        expected = {
            (): (0, 0),
            ("listing",): (0, 0),
            ("listing", "health_route"): (0, 0),
            ("nvml",): (0, 1),
            ("started",): (0, 1),
        }
        for failed, (live, ready) in expected.items():
            answers.append(_health(*failed))
            assert (await _probe(script, "live"))[0] == live, failed
            code, err = await _probe(script, "ready")
            assert code == ready, (failed, err)
            if ready:
                assert "not ready" in err and failed[0] in err
    finally:
        await runner.cleanup()
