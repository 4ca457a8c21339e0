"""Ollama loads a model when asked with nothing to run (`OllamaResidents.warm`): a chat
model by `/api/generate` with no prompt, an embedding model (which `/api/generate`
refuses) by `/api/embed` with no input; each with its keep_alive, answered once loaded."""

from __future__ import annotations

import aiohttp
import pytest

from gpugate.core.units import GiB
from gpugate.runtimes.ollama.listing import OllamaError
from gpugate.runtimes.ollama.upstream import OllamaResidents
from gpugate_sim.device import SimulatedGpuHost
from gpugate_sim.ollama import SimOllama
from gpugate_sim.ollama.state import RunnerPhase
from gpugate_sim.scenario import OllamaModelSpec, OllamaSpec
from tests.config.helpers import load, ollama

CHAT = OllamaModelSpec("llama3.2", size=3 * GiB, load_seconds=0.02, family="llama")
EMBED = OllamaModelSpec(
    "bge-m3", size=1 * GiB, load_seconds=0.02, embedding=True, embedding_length=8, family="bert"
)


@pytest.fixture
async def sim(sim_host: SimulatedGpuHost):
    server = SimOllama(OllamaSpec(models=(CHAT, EMBED)), sim_host)
    await server.start("127.0.0.1", 0)
    yield server
    await server.close()


def residents(sim: SimOllama) -> OllamaResidents:
    config = load(ollama(upstream=sim.url)).config
    return OllamaResidents(config.consumer("ollama"))


async def test_a_chat_and_an_embedding_model_are_loaded_with_their_keep_alive(sim):
    warm = residents(sim)
    assert warm.warms
    async with aiohttp.ClientSession() as session:
        await warm.warm(session, "llama3.2:latest", 600.0)
        await warm.warm(session, "bge-m3:latest", None)
    state = sim.state()
    chat, embed = state.runner("llama3.2:latest"), state.runner("bge-m3:latest")
    assert chat is not None and chat.phase is RunnerPhase.READY and chat.refcount == 0
    assert chat.keep_alive == 600.0
    assert embed is not None and embed.phase is RunnerPhase.READY and embed.refcount == 0
    assert embed.keep_alive is None  # -1: until unloaded


async def test_a_model_ollama_does_not_have_fails_and_loads_nothing(sim):
    warm = residents(sim)
    async with aiohttp.ClientSession() as session:
        with pytest.raises(OllamaError, match="answered 404"):
            await warm.warm(session, "nope:latest", 60.0)
    assert sim.state().runners == ()
