"""The simulated ComfyUI refuses the refusal corpus as ComfyUI 0.3.64 did (status and body;
the order of a node's errors, which follows ComfyUI's set iteration, and tracebacks aside;
for the few bodies that set order changes, status and error type)."""

from __future__ import annotations

import aiohttp

from tests.runtimes.comfyui_refusals import ORDER_DEPENDENT, answers, corpus, lay_out, normal
from tests.sim.comfyui_helpers import comfy, make_comfy, session  # noqa: F401


async def test_the_corpus_is_refused_as_comfyui_refused_it(make_comfy, session):  # noqa: F811
    sim = await make_comfy(custom_nodes=("checked_nodes",))
    lay_out(sim.input_dir, sim.output_dir)
    recorded = answers()
    prompts = corpus()
    assert len(prompts) >= 150 and set(recorded) == {what for what, _ in prompts}
    differ = []
    for what, prompt in prompts:
        async with session.post(f"{sim.url}/prompt", json={"prompt": prompt}) as resp:
            status, body = resp.status, await resp.json()
        expected = recorded[what]
        if what in ORDER_DEPENDENT:
            got = (status, body["error"]["type"])
            if got != (expected["status"], expected["body"]["error"]["type"]):
                differ.append((what, status, body))
        elif (status, normal(body)) != (expected["status"], normal(expected["body"])):
            differ.append((what, status, body))
    assert differ == []
    # Nothing was queued: a refused prompt never reaches the queue.
    async with session.get(f"{sim.url}/queue") as resp:
        assert await resp.json() == {"queue_running": [], "queue_pending": []}


async def test_a_file_it_has_is_no_refusal(make_comfy, session: aiohttp.ClientSession):  # noqa: F811
    sim = await make_comfy(custom_nodes=("checked_nodes",))
    lay_out(sim.input_dir, sim.output_dir)
    for name in ("example.png", "sub/in-sub.png", "made.png [output]", "", "dir.png"):
        prompt = {
            "1": {"class_type": "LoadImage", "inputs": {"image": name}},
            "2": {"class_type": "PreviewImage", "inputs": {"images": ["1", 0]}},
        }
        async with session.post(f"{sim.url}/prompt", json={"prompt": prompt}) as resp:
            assert resp.status == 200, (name, await resp.text())
