"""A prompt ComfyUI will refuse is refused by the gate with ComfyUI's own answer, before any
lease: nobody's model is evicted for it. The gate validates as ComfyUI does, against the node
catalog ComfyUI itself serves at /object_info."""

from __future__ import annotations

import json

import aiohttp
import attrs
import pytest

from gpugate.core.job_leases import JOBS_MODEL
from gpugate.gate.exchange import LEASE_HEADER
from gpugate_sim.scenario import ComfyModelFile
from tests.gate.comfyui_stack import COMFY_MODELS, comfy_stack
from tests.sim.comfyui_helpers import flux, txt2img


@pytest.fixture
async def stack(tmp_path, sim_host, fakenvml_path):
    async with comfy_stack(tmp_path, sim_host, fakenvml_path) as stack:
        yield stack


async def post(session, url, body):
    async with session.post(url + "/prompt", data=json.dumps(body).encode()) as resp:
        return resp.status, resp.headers, await resp.read()


def missing_steps():
    graph = txt2img()
    del graph["3"]["inputs"]["steps"]
    return graph


def wrong_type():
    graph = txt2img()
    graph["3"]["inputs"]["steps"] = "many"
    return graph


def unknown_class():
    graph = txt2img()
    graph["10"] = {"class_type": "NoSuchNode", "inputs": {}}
    return graph


def no_weight_dtype():
    graph = flux()
    del graph["1"]["inputs"]["weight_dtype"]
    return graph


@pytest.mark.parametrize(
    ("graph", "error_type"),
    [
        (txt2img(ckpt="not-on-disk.safetensors"), "prompt_outputs_failed_validation"),
        (missing_steps(), "prompt_outputs_failed_validation"),
        (wrong_type(), "prompt_outputs_failed_validation"),
        (unknown_class(), "invalid_prompt"),
        (no_weight_dtype(), "prompt_outputs_failed_validation"),
    ],
)
async def test_a_prompt_comfyui_refuses_gets_its_answer_and_no_lease(stack, graph, error_type):
    body = {"prompt": graph, "client_id": "c1"}
    async with aiohttp.ClientSession() as session:
        gated = await post(session, stack.gate_comfy, body)
        direct = await post(session, stack.direct_comfy, body)
    status, headers, answer = gated
    # ComfyUI's own 400 and body; tracebacks are ComfyUI's to write, so compare the rest.
    assert (status, direct[0]) == (400, 400)
    assert LEASE_HEADER not in headers
    gated_doc, direct_doc = json.loads(answer), json.loads(direct[2])
    assert gated_doc["error"]["type"] == direct_doc["error"]["type"] == error_type
    for doc in (gated_doc, direct_doc):
        for node in doc["node_errors"].values():
            for error in node["errors"]:
                error["extra_info"].pop("traceback", None)
    assert gated_doc == direct_doc
    assert stack.gate.jobs.live("comfyui") == []
    assert [x for x in stack.gate.core.leases() if x.key.consumer == "comfyui"] == []
    assert not [e for e in stack.gate.recent_events() if e.kind.value == "eviction_started"]


async def test_a_prompt_comfyui_accepts_is_leased(stack):
    async with aiohttp.ClientSession() as session:
        status, headers, answer = await post(session, stack.gate_comfy, {"prompt": txt2img()})
    assert status == 200, answer
    assert LEASE_HEADER in headers
    assert [x.key.model for x in stack.gate.core.leases()].count(JOBS_MODEL) == 1


async def test_a_file_added_since_the_catalog_was_read_is_no_refusal(stack):
    async with aiohttp.ClientSession() as session:
        # The catalog is read with the first prompt.
        assert (await post(session, stack.gate_comfy, {"prompt": txt2img()}))[0] == 200
        added = ComfyModelFile("checkpoints", "new-model.safetensors", 2034 * 1024**2)
        stack.comfy.spec = attrs.evolve(stack.comfy.spec, models=(*COMFY_MODELS, added))
        graph = txt2img(ckpt="new-model.safetensors", seed=2)
        status, headers, answer = await post(session, stack.gate_comfy, {"prompt": graph})
    assert status == 200, answer
    assert LEASE_HEADER in headers


async def test_with_validation_off_a_refused_prompt_is_admitted_as_before(
    tmp_path, sim_host, fakenvml_path
):
    async with (
        comfy_stack(
            tmp_path, sim_host, fakenvml_path, more="    validate_prompts: false\n"
        ) as stack,
        aiohttp.ClientSession() as session,
    ):
        graph = txt2img(ckpt="not-on-disk.safetensors")
        status, headers, _ = await post(session, stack.gate_comfy, {"prompt": graph})
    assert status == 400
    assert LEASE_HEADER in headers  # leased, then ComfyUI refused it


async def test_a_catalog_comfyui_does_not_serve_means_admission_as_before(stack, caplog):
    stack.gate.links["comfyui"].runtime.vetting.base_url = stack.direct_comfy + "/nowhere"
    async with aiohttp.ClientSession() as session:
        status, headers, _ = await post(session, stack.gate_comfy, {"prompt": txt2img()})
    assert status == 200
    assert LEASE_HEADER in headers
    assert "admitted a request unvetted" in caplog.text
