"""/v1/audio/transcriptions: the form read as Ollama's middleware reads it, then a chat."""

from __future__ import annotations

from aiohttp import web

from gpugate.sim.ollama.catalog import Capability
from gpugate.sim.ollama.engine import Finished, GenerationFailed, Token
from gpugate.sim.ollama.gofold import go_quote
from gpugate.sim.ollama.openai_convert import form_model
from gpugate.sim.ollama.options import parse_options
from gpugate.sim.ollama.record import reading
from gpugate.sim.ollama.runnerref import ScheduleError
from gpugate.sim.ollama.services import services
from gpugate.sim.ollama.wire import encoder_response, openai_error


async def transcriptions(request: web.Request) -> web.StreamResponse:
    svc = services(request)
    form = form_model(
        await request.read(), request.headers.get("Content-Type", ""), request.query_string
    )
    if isinstance(form, str):
        return openai_error(400, form)
    name, audio = form
    model = svc.catalog.lookup(name)
    if model is None:
        return openai_error(404, f"model '{name}' not found")
    if Capability.COMPLETION not in model.capabilities:
        return openai_error(400, f"{go_quote(name)} does not support chat")
    options = parse_options(model, {}, runner_options=False)
    try:
        loading = reading(request).loading(model, None, None)
        lease = await svc.scheduler.acquire(loading, options, None)
    except ScheduleError as exc:
        return openai_error(exc.status, exc.message)
    text: list[str] = []
    try:
        async for event in svc.engine.complete(lease, f"transcribe {audio} bytes", options):
            if isinstance(event, Token):
                text.append(event.text)
            elif isinstance(event, Finished):
                break
    except GenerationFailed as failure:
        return openai_error(500, failure.message)
    finally:
        svc.scheduler.release(lease)
    return encoder_response({"text": "".join(text)})
