"""vLLM behind the gate: a server that holds its card share while awake and gives all but a
residual back asleep. Its memory is a process's (runtimes/controlled.py) and its lifecycle
sleeps (sleep.py): the core's evictions of it are Sleep effects, its starts Wake effects.

* Which requests need it awake: its generation and pooling routes (POST). `/health`,
  `/v1/models`, `/version`, `/tokenize` and the sleep routes answer asleep as awake.
* An eviction is `POST /sleep?level=N` (the consumer's `sleep_level`): confirmed when NVML
  shows 75 % of the resident's bytes back (the CUDA context stays).
* The gate's refusals in vLLM's error shape:
  `{"error": {"message", "type", "param", "code"}}`, `code` the HTTP status.
"""

from __future__ import annotations

import math

from gpugate.config.model import Consumer
from gpugate.runtimes.answers import ApiFamily, Classified, ReclaimRule, RouteKind
from gpugate.runtimes.controlled import ProcessModel, process_runtime
from gpugate.runtimes.dialect import ServerDialect
from gpugate.runtimes.footprint import Cap, Cards, Elasticity, Footprint, Knob
from gpugate.runtimes.keepalive import UVICORN
from gpugate.runtimes.parts import Memory, Reading
from gpugate.runtimes.runtime import ModelSettings, Runtime
from gpugate.runtimes.vllm.settings import VllmSettings
from gpugate.runtimes.vllm.sleep import SleepMode

AWAKE_ROUTES = frozenset(
    {
        "/v1/chat/completions",
        "/v1/completions",
        "/v1/embeddings",
        "/v1/responses",
        "/v1/audio/transcriptions",
        "/v1/audio/translations",
        "/pooling",
        "/classify",
        "/score",
        "/v1/score",
        "/rerank",
        "/v1/rerank",
        "/v2/rerank",
        "/invocations",
    }
)
"""POST routes that run the engine (vllm/entrypoints/openai/api_server.py build_app)."""


class VllmReading(Reading):
    """vLLM's requests pass as they are; its refusals are the gate's, in its shape."""

    # uvicorn's httptools protocol (vllm/entrypoints/launcher.py `serve_http` leaves
    # `http="auto"`, and vLLM's `fastapi[standard]` installs httptools): proxy/dialects/uvicorn.py
    dialect = ServerDialect.UVICORN
    keep_alive = UVICORN

    def wants_body(self, method: str, path: str) -> bool:
        return False

    def classify(
        self, method: str, path: str, body: bytes | None, content_type: str, *, query: str = ""
    ) -> Classified:
        return Classified(RouteKind.PASS, ApiFamily.VLLM)


def needs_process(method: str, path: str) -> bool:
    """Whether the request runs the engine (it must be awake)."""
    return method == "POST" and path in AWAKE_ROUTES


DEFAULT_UTILIZATION = 0.9
"""`--gpu-memory-utilization`'s default (vllm/config/cache.py `gpu_memory_utilization`)."""
UTILIZATION_KNOB = Knob(("--gpu-memory-utilization",))
"""vLLM's argument parser reads `--gpu_memory_utilization` and `=VALUE` too
(vllm/utils FlexibleArgumentParser): `Knob.set_in` counts both."""


def utilization_cap(nbytes: int, total: int) -> Cap | None:
    """`--gpu-memory-utilization`: the fraction of a card of `total` bytes that `nbytes`
    is, rounded down to a thousandth (so vLLM's share stays within it); None for a card
    of no size."""
    if total <= 0:
        return None
    share = math.floor(1000 * min(1.0, nbytes / total)) / 1000
    return Cap(args=("--gpu-memory-utilization", f"{share:.3f}"), knob=UTILIZATION_KNOB)


class VllmMemory(Memory):
    """vLLM takes `--gpu-memory-utilization` of the card's total at start, whatever its
    model (vllm/v1/worker/gpu_worker.py `determine_available_memory`: the KV cache gets
    `total × utilization` less the weights and the profiled activations), and gives all
    but its CUDA context back asleep. What a wake takes back is the consumer's envelope;
    the knob is the fraction itself, derived from what the gate may give it."""

    elasticity = Elasticity.SHARE
    knob = "--gpu-memory-utilization"

    def __init__(self, settings: ModelSettings, model: ProcessModel) -> None:
        super().__init__(settings)
        self.model = model

    def utilization(self) -> float:
        """The fraction its command asks for (the default when it names none)."""
        text = self.model.commanded_model("--gpu-memory-utilization")
        try:
            value = float(text) if text is not None else DEFAULT_UTILIZATION
        except ValueError:
            value = DEFAULT_UTILIZATION
        return value if 0 < value <= 1 else DEFAULT_UTILIZATION

    def read(self, model: str, cards: Cards) -> Footprint | None:
        """Its share of the first card (None before a sample said how big it is)."""
        if not cards.totals:
            return None
        return Footprint.fixed(int(cards.totals[0] * self.utilization()))

    def cap(self, model: str, nbytes: int, cards: Cards) -> Cap | None:
        """The fraction of the card `nbytes` is (`utilization_cap`). The gate does not
        start vLLM: this is what `gpugate init` writes into its drop-in."""
        return utilization_cap(nbytes, cards.totals[0]) if cards.totals else None


def vllm_runtime(consumer: Consumer) -> Runtime:
    """One vLLM server with sleep mode behind the gate: its lifecycle sleeps; `GET /health`
    answers 200 while the engine lives (asleep too)."""
    control = consumer.control
    timeout = control.start_timeout if control is not None else 120.0
    sleep = SleepMode(
        consumer.upstream.url,
        level=consumer.settings_as(VllmSettings).sleep_level,
        timeout=timeout,
    )
    model = ProcessModel(consumer)
    return process_runtime(
        consumer,
        VllmReading(),
        model,
        control=sleep,
        health_path="/health",
        needs_process=needs_process,
        # The CUDA context stays while it sleeps.
        reclaim_rule=ReclaimRule(recovered_fraction=0.75),
        memory=lambda settings: VllmMemory(settings, model),
    )
