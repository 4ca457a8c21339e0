"""Ollama's own 500 for a request it refuses once the model is loaded is not a failed load.

Ollama v0.24.0 loads the model first and only then parses a request's own `template`
(GenerateHandler) and checks its `format` (llmServer.Completion): the answer is a 500, the
model is resident, and the gate must neither label it MODEL_LOAD_FAILED nor forget the
model it leased for (docs/runtimes/ollama.md, "Refused once loaded").
"""

from __future__ import annotations

import aiohttp
import ollama
import pytest

from gpugate.core.effects import Event, EventKind

MODEL = "llama3.2:3b"


def _failures(stack) -> list[Event]:
    found: list[Event] = []
    stack.gate.events.subscribe(lambda e: found.append(e) if e.kind is EventKind.FAILURE else None)
    return found


def _resident(stack) -> list[str]:
    return [r.key.model for r in stack.gate.core.residents()]


async def test_a_template_ollama_cannot_parse_is_its_refusal_with_the_model_loaded(stack):
    failures = _failures(stack)
    client = ollama.AsyncClient(host=stack.gate_url)
    with pytest.raises(ollama.ResponseError) as refused:
        await client.generate(model=MODEL, prompt="x", template="{{", options={"num_predict": 1})
    assert refused.value.status_code == 500
    assert refused.value.error == "template: :1: unclosed action"
    assert failures == []
    # The lease for the load ended as a loaded model's does: resident in the books and in
    # Ollama's listing, nothing left leased.
    assert _resident(stack) == [MODEL]
    assert [m["name"] for m in await stack.ps()] == [MODEL]
    assert stack.gate.core.leases() == []
    # The same model, asked properly, is served from memory.
    answer = await client.generate(model=MODEL, prompt="x", options={"num_predict": 1})
    assert answer.done


@pytest.mark.parametrize(
    ("stream", "content_type"),
    [(None, "application/json"), (False, "application/json; charset=utf-8")],
)
async def test_a_format_ollama_refuses_is_answered_as_ollama_answers_it(
    stack, stream, content_type
):
    # The official client refuses `format: "yaml"` itself; a plain HTTP client sends it.
    failures = _failures(stack)
    body: dict[str, object] = {"model": MODEL, "prompt": "x", "format": "yaml"}
    if stream is not None:
        body["stream"] = stream
    async with (
        aiohttp.ClientSession() as session,
        session.post(stack.gate_url + "/api/generate", json=body) as resp,
    ):
        status, headers, raw = resp.status, resp.headers, await resp.read()
    assert status == 500
    assert "X-GPUGate-Failure" not in headers
    assert "X-GPUGate-Lease" in headers  # it loaded under a lease
    assert headers["Content-Type"] == content_type
    assert raw == (
        b'{"error":"invalid format: \\"\\\\\\"yaml\\\\\\"\\"; expected \\"json\\" '
        b'or a valid JSON Schema object"}'
    )
    assert failures == []
    assert _resident(stack) == [MODEL]
    assert stack.gate.core.leases() == []


async def test_a_load_that_fails_is_still_a_failed_load(stack):
    # The answer's own words decide: a 500 that is not a refusal of the request's format or
    # template, even for a request that carries one, is the load's failure.
    failed = stack.next_event(EventKind.FAILURE, model=MODEL)
    body = {"model": MODEL, "prompt": "x", "format": "yaml", "options": {"sim_load_fail": True}}
    async with (
        aiohttp.ClientSession() as session,
        session.post(stack.gate_url + "/api/generate", json=body) as resp,
    ):
        assert resp.status == 500
        assert resp.headers["X-GPUGate-Failure"] == "MODEL_LOAD_FAILED"
    assert (await failed).failure.failure_class.value == "MODEL_LOAD_FAILED"
    assert stack.gate.core.residents() == []
    assert stack.gate.core.leases() == []
