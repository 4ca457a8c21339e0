"""A whole stack in one event loop: simulated GPU, simulated Ollama, and the gate in front.

The gate runs through `gpugate.serve.serve` (the real listeners), reads the simulated GPU
through the real pynvml over the fake library, and attributes runner processes through
the real /proc. Only ports are chosen here.
"""

from __future__ import annotations

import asyncio
import contextlib
import textwrap
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import aiohttp
import attrs

from gpugate.config.model import Config
from gpugate.core.effects import Event, EventKind
from gpugate.core.units import MiB
from gpugate.gate.gate import Gate
from gpugate.runtimes.sections import load_config_text
from gpugate_sim.device import SimulatedGpuHost
from gpugate_sim.ollama.server import SimOllama
from gpugate_sim.scenario import OllamaModelSpec, OllamaSpec
from tests.ports import free_ports
from tests.serving import serving

FAST = dict(load_seconds=0.05, tokens_per_second=400.0)
MODELS = (
    OllamaModelSpec("gemma3:12b", 7796 * MiB, family="gemma3", **FAST),
    OllamaModelSpec("bge-m3", 2012 * MiB, embedding=True, family="bert", **FAST),
    OllamaModelSpec("llama3.2:3b", 3200 * MiB, **FAST),
    OllamaModelSpec("qwen2.5:7b", 5700 * MiB, family="qwen2", **FAST),
)

PRODUCTION = """\
identities:
  - name: ops
    tokens: [prod-token]
    class: production
"""
"""An identity whose token (`Bearer prod-token`) makes a request production class."""
DEFAULT_MODELS_YAML = """\
gemma3:12b: {envelope: 7796MiB}
bge-m3: {class: background, envelope: 2012MiB, residency: {policy: keep_warm, ttl: 901s}}
llama3.2:3b: {envelope: 3200MiB}
qwen2.5:7b: {envelope: 5700MiB}
"""


@attrs.define
class Stack:
    host: SimulatedGpuHost
    sim: SimOllama
    gate: Gate
    config: Config
    gate_url: str
    control_url: str
    lines: list[str] = attrs.field(factory=list)
    """What `gpugate serve` printed once ready, its last line `gpugate: ready ...`."""

    @property
    def sim_url(self) -> str:
        assert self.sim.url is not None
        return self.sim.url

    def next_event(self, kind: EventKind, **match: object) -> asyncio.Future[Event]:
        """A future for the next event of this kind whose fields match (register first)."""

        def wanted(event: Event) -> bool:
            return event.kind is kind and all(getattr(event, k) == v for k, v in match.items())

        return self.gate.events.next(wanted)

    def trail(self) -> str:
        """The gate's recent events, one a line: what an assertion about them shows."""
        return "\n".join(
            f"{e.time:.3f} {e.kind.value} {e.model} {e.bytes} {e.reason} {e.detail}"
            for e in self.gate.recent_events()
        )

    async def ps(self) -> list[dict]:
        async with (
            aiohttp.ClientSession() as session,
            session.get(self.sim_url + "/api/ps") as resp,
        ):
            return (await resp.json())["models"]


def config_text(
    *,
    upstream: str,
    listen_port: int,
    control_port: int,
    library: Path,
    database: Path | None,
    models_yaml: str,
    extra: str,
    consumer_yaml: str = "",
    grace: str = "2s",
    listen_host: str = "127.0.0.1",
    sample_interval: str = "200ms",
    stale_after: str = "5s",
) -> str:
    models = textwrap.indent(models_yaml, " " * 6)
    more = textwrap.indent(consumer_yaml, " " * 4)
    db = f"\n  database: {database}" if database else ""
    return f"""\
gate:
  control: 127.0.0.1:{control_port}
  shutdown_grace: {grace}
  nvml_library: {library}{db}
budget:
  reserve: 1GiB
  reserve_max: 1GiB
  sample_interval: {sample_interval}
  stale_after: {stale_after}
  reclaim_timeout: 5s
consumers:
  ollama:
    runtime: ollama
    listen: {listen_host}:{listen_port}
    upstream: {upstream}
    class: interactive
    residency: {{policy: keep_warm, ttl: 15m}}
    processes: {{commands: [llama-server], names: [llama-server]}}
{more}    models:
{models}
{extra}"""


@contextlib.asynccontextmanager
async def running_stack(
    tmp_path: Path,
    host: SimulatedGpuHost,
    library: Path,
    *,
    models: tuple[OllamaModelSpec, ...] = MODELS,
    models_yaml: str = DEFAULT_MODELS_YAML,
    extra: str = "",
    consumer_yaml: str = "",
    spec: Callable[[OllamaSpec], OllamaSpec] | None = None,
    database: bool = False,
    grace: str = "2s",
    listen_host: str = "127.0.0.1",
    upstream: str | None = None,
    sample_interval: str = "200ms",
    stale_after: str = "5s",
) -> AsyncIterator[Stack]:
    """`listen_host`: the gate's listener address; `upstream`: another server than the sim."""
    ollama_spec = OllamaSpec(listen="127.0.0.1:0", keep_alive="5m", models=models)
    if spec is not None:
        ollama_spec = spec(ollama_spec)
    sim = SimOllama(ollama_spec, host)
    sim_url = await sim.start()
    upstream = upstream or sim_url
    listen_port, control_port = free_ports(2)
    text = config_text(
        upstream=upstream,
        listen_port=listen_port,
        control_port=control_port,
        library=library,
        database=tmp_path / "gpugate.db" if database else None,
        models_yaml=models_yaml,
        extra=extra,
        consumer_yaml=consumer_yaml,
        grace=grace,
        listen_host=listen_host,
        sample_interval=sample_interval,
        stale_after=stale_after,
    )
    config = load_config_text(text, tmp_path / "consumers.yaml")
    try:
        async with serving(config) as served:
            lines = served.lines
            gate_url = lines[0].split(" listening on ")[1].split(" ")[0]
            control_url = next(x for x in lines if "control on" in x).split(" on ")[1]
            control_url = control_url.split(" ")[0]
            yield Stack(host, sim, served.gate, config, gate_url, control_url, lines)
    finally:
        await sim.close()
