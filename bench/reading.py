"""What reading a request costs the gate, per request, in-process: the runtime's own reading.

    python -m bench.reading            # prints the table
    python -m bench.reading --write    # and writes it into docs/benchmarks.md

Ollama: `classify` of each body as the gate reads it (Go's decoding into the route's
request type, the handler's pre-load checks, what it needs of its model, the keep_alive
splice). ComfyUI: `classify` of a `POST /prompt` (the prompt's files and latent), then its
validation against the simulated ComfyUI's `/object_info` catalog, as `PromptVetting` runs
it. Each figure is CPU time of this thread per call (`time.thread_time_ns`, so the other
programs on a shared machine add little), the median of `ROUNDS` rounds of `CALLS` calls.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from collections.abc import Callable

import attrs

from bench.docfile import write_section
from bench.runtimes import sd15_prompt
from gpugate.config.model import Address, Consumer, Residency, Upstream
from gpugate.core.classes import ResidencyPolicy
from gpugate.runtimes.comfyui.adapter import comfyui_runtime
from gpugate.runtimes.comfyui.catalog import parse_object_info
from gpugate.runtimes.comfyui.graph import PromptDemand
from gpugate.runtimes.comfyui.validation import Outcome, validate
from gpugate.runtimes.ollama.adapter import ollama_runtime
from gpugate_sim.comfyui.catalog import object_info
from tests.sim.comfyui_helpers import MODELS, flux

CALLS = 5000
ROUNDS = 5
MESSAGES = [
    {"role": "system", "content": "You are a helpful assistant. Answer briefly."},
    {"role": "user", "content": "What is the capital of France?"},
    {"role": "assistant", "content": "Paris."},
    {"role": "user", "content": "And of Italy? Tell me a little of its history, please."},
]
FRENCH = {"role": "user", "content": "Et l'Italie, s'il te plaît ?"}
HISTORY = (
    "A turn of a long conversation, as a chat client sends the whole of it every time: "
    '"quoted" words, a line break,\nand now and then a word from elsewhere (déjà vu, 東京).\n'
) * 2
"""One message of the long history (344 bytes of UTF-8)."""
OLLAMA_BODIES = (
    (
        "/api/generate (the runtime bench's body)",
        "/api/generate",
        {"model": "llama3.2:3b", "prompt": "hi", "stream": True, "options": {"num_predict": 2}},
    ),
    (
        "/api/chat, 4 messages, options, keep_alive",
        "/api/chat",
        {
            "model": "llama3.2:3b",
            "messages": MESSAGES,
            "stream": True,
            "options": {"temperature": 0.7, "num_ctx": 8192, "top_p": 0.9, "num_predict": 256},
            "keep_alive": "10m",
        },
    ),
    (
        "/api/chat, the same in French (escaped non-ASCII text)",
        "/api/chat",
        {
            "model": "llama3.2:3b",
            "messages": [*MESSAGES[:3], FRENCH],
            "stream": True,
            "options": {"temperature": 0.7, "num_ctx": 8192, "top_p": 0.9, "num_predict": 256},
            "keep_alive": "10m",
        },
    ),
    (
        "/api/chat, the same with `Keep_Alive` (Go's folding: the full reading)",
        "/api/chat",
        {
            "model": "llama3.2:3b",
            "messages": MESSAGES,
            "stream": True,
            "options": {"temperature": 0.7, "num_ctx": 8192, "top_p": 0.9, "num_predict": 256},
            "Keep_Alive": "10m",
        },
    ),
    (
        "/api/chat, 40 messages of history, UTF-8 as sent (15 KiB), keep_alive",
        "/api/chat",
        json.dumps(
            {
                "model": "llama3.2:3b",
                "messages": [
                    {"role": ("user", "assistant")[i % 2], "content": HISTORY}
                    for i in range(40)
                ],
                "stream": True,
                "options": {"temperature": 0.7, "num_ctx": 8192},
                "keep_alive": "10m",
            },
            ensure_ascii=False,
        ).encode(),
    ),
    (
        "/v1/chat/completions, 4 messages",
        "/v1/chat/completions",
        {"model": "llama3.2:3b", "messages": MESSAGES, "stream": True, "temperature": 0.7,
         "max_tokens": 256},
    ),
)  # fmt: skip


@attrs.frozen
class Row:
    runtime: str
    what: str
    micros: float


def per_call(call: Callable[[], object]) -> float:
    """CPU µs per call, the median of the rounds."""
    for _ in range(CALLS // 10):
        call()
    rounds = []
    for _ in range(ROUNDS):
        start = time.thread_time_ns()
        for _ in range(CALLS):
            call()
        rounds.append((time.thread_time_ns() - start) / CALLS / 1000)
    return statistics.median(rounds)


def _consumer(name: str, runtime: str, port: int) -> Consumer:
    return Consumer(
        name=name,
        runtime=runtime,
        listen=Address("127.0.0.1", port),
        upstream=Upstream("http", "127.0.0.1", port + 1),
        residency=Residency(ResidencyPolicy.KEEP_WARM, 900.0),
    )


def ollama_rows() -> list[Row]:
    reading = ollama_runtime(_consumer("ollama", "ollama", 11434)).reading
    rows = []
    for what, path, body in OLLAMA_BODIES:
        raw = body if isinstance(body, bytes) else json.dumps(body).encode()

        def call(path: str = path, raw: bytes = raw) -> object:
            return reading.classify("POST", path, raw, "application/json")

        rows.append(Row("Ollama", f"classify {what}", per_call(call)))
    return rows


def comfyui_rows() -> list[Row]:
    files: dict[str, list[str]] = {}
    for model in MODELS:
        files.setdefault(model.folder, []).append(model.name)
    catalog = parse_object_info(json.loads(json.dumps(object_info(files))))
    reading = comfyui_runtime(_consumer("comfyui", "comfyui", 8188)).reading
    rows = []
    graphs = (
        ("SD 1.5", sd15_prompt()),
        ("FLUX", json.dumps({"prompt": flux(), "client_id": "bench"}).encode()),
    )
    for what, body in graphs:
        demand = reading.classify("POST", "/prompt", body, "application/json").reading
        assert isinstance(demand, PromptDemand)
        assert validate(demand.prompt, catalog, demand.targets, {}).outcome is Outcome.QUEUE

        def read(body: bytes = body) -> object:
            return reading.classify("POST", "/prompt", body, "application/json")

        def check(demand: PromptDemand = demand) -> object:
            return validate(demand.prompt, catalog, demand.targets, {})

        read_us, check_us = per_call(read), per_call(check)
        rows.append(Row("ComfyUI", f"POST /prompt {what}: classify", read_us))
        rows.append(Row("ComfyUI", f"POST /prompt {what}: validate", check_us))
    return rows


def table(rows: list[Row]) -> str:
    lines = [
        f"Measured {time.strftime('%Y-%m-%d')}, `python -m bench.reading`: CPU µs per call of "
        f"this thread, the median of {ROUNDS} rounds of {CALLS:,} calls.",
        "",
        "| runtime | what | µs |",
        "|---|---|---:|",
    ]
    lines += [f"| {r.runtime} | {r.what} | {r.micros:.1f} |" for r in rows]
    return "\n".join(lines)


def main() -> None:
    text = table(ollama_rows() + comfyui_rows())
    print(text)
    if "--write" in sys.argv[1:]:
        write_section("reading", text)


if __name__ == "__main__":
    main()
