"""The simulated ComfyUI reads bodies up to its `--max-upload-size`, as ComfyUI does."""

from __future__ import annotations

import json

from gpugate.runtimes.comfyui.adapter import MAX_UPLOAD_SIZE
from gpugate_sim.scenario import ComfyUISpec
from tests.sim.comfyui_helpers import comfy, make_comfy, session

__all__ = ["comfy", "make_comfy", "session"]


def test_the_default_limit_is_comfyuis_and_the_gates():
    # server.py: client_max_size = round(args.max_upload_size * 1024 * 1024), default 100.
    assert round(ComfyUISpec().max_upload_size * 1024 * 1024) == MAX_UPLOAD_SIZE


async def test_a_prompt_past_max_upload_size_is_aiohttps_413(make_comfy, session):
    sim = await make_comfy(max_upload_size=0.01)
    limit = round(0.01 * 1024 * 1024)
    head = json.dumps({"prompt": {}}).encode()
    answers = []
    for size in (limit, limit + 1):
        body = head + b" " * (size - len(head))
        async with session.post(sim.url + "/prompt", data=body) as resp:
            answers.append((resp.status, resp.headers["Content-Type"], await resp.read()))
    # At the limit ComfyUI reads the prompt (an empty one is its own 400); past it, no.
    assert answers[0][0] == 400
    assert answers[1] == (
        413,
        "text/plain; charset=utf-8",
        f"Maximum request body size {limit} exceeded.".encode(),
    )
