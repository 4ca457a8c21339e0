"""Deterministic generation and embeddings on a leased runner.

The text is a function of the prompt alone, so two runs of the same request produce the
same bodies apart from timestamps and durations. Tokens arrive at the model's token rate
(the simulated inference time), one runner slot per generation.
"""

from __future__ import annotations

import asyncio
import enum
import hashlib
import math
import re
from collections.abc import AsyncIterator

import attrs

from gpugate_sim.ollama.options import RequestOptions
from gpugate_sim.ollama.runnerref import Lease
from gpugate_sim.ollama.scheduler import Scheduler
from gpugate_sim.scenario import OllamaSpec

# fmt: off
VOCABULARY = (
    "the", "model", "answers", "with", "a", "short", "and", "steady", "line", "of", "words",
    "that", "only", "depend", "on", "prompt", "so", "every", "run", "reads", "same", "way",
    "memory", "card", "holds", "weights", "while", "cache", "grows", "tokens", "flow", "out",
    "gate", "lease", "budget", "fits", "load", "unload", "keep", "alive", "timer", "ends",
)
# fmt: on
MIN_TOKENS = 6
MAX_EXTRA_TOKENS = 26
MIDSTREAM_ERROR = "an error was encountered while running the model: unexpected EOF"


class DoneReason(enum.Enum):
    STOP = "stop"
    LENGTH = "length"
    LOAD = "load"
    UNLOAD = "unload"


@attrs.frozen
class Token:
    text: str


@attrs.frozen
class Finished:
    """The end of a generation, with Ollama's metrics (durations in nanoseconds)."""

    done_reason: DoneReason
    prompt_eval_count: int
    prompt_eval_ns: int
    eval_count: int
    eval_ns: int
    context: tuple[int, ...]


class GenerationFailed(Exception):
    """The runner failed mid-generation (simulated with `sim_fail_after_tokens`)."""

    def __init__(self, message: str = MIDSTREAM_ERROR) -> None:
        super().__init__(message)
        self.message = message


@attrs.frozen
class Plan:
    tokens: tuple[str, ...]
    done_reason: DoneReason
    prompt_tokens: int


def _words(text: str) -> list[str]:
    return re.findall(r"\w+|[^\w\s]", text)


def plan(prompt: str, num_predict: int, length: int | None = None) -> Plan:
    """The tokens a prompt produces: a fixed function of the prompt, cut at num_predict.

    `length` (the `sim_tokens` option) fixes how long the answer is, for long streams.
    """
    digest = hashlib.shake_256(prompt.encode()).digest(MIN_TOKENS + MAX_EXTRA_TOKENS + 1)
    natural = MIN_TOKENS + digest[0] % MAX_EXTRA_TOKENS
    length = natural if length is None else length
    words = [VOCABULARY[digest[1 + i % natural] % len(VOCABULARY)] for i in range(length)]
    tokens = [words[0].capitalize(), *(" " + w for w in words[1:])]
    tokens[-1] += "."
    reason = DoneReason.STOP
    if 0 < num_predict < len(tokens):
        tokens = tokens[:num_predict]
        reason = DoneReason.LENGTH
    return Plan(tuple(tokens), reason, len(_words(prompt)) + 1)


def context_ids(text: str) -> tuple[int, ...]:
    """Token ids for /api/generate's `context` (stable, like a tokenizer's)."""
    return tuple(int.from_bytes(hashlib.sha1(w.encode()).digest()[:2], "big") for w in _words(text))


def embedding(text: str, dimensions: int) -> list[float]:
    """A unit vector that depends only on the text."""
    raw = hashlib.shake_256(text.encode()).digest(2 * dimensions)
    values = [
        int.from_bytes(raw[2 * i : 2 * i + 2], "big") / 32767.5 - 1.0 for i in range(dimensions)
    ]
    norm = math.sqrt(sum(v * v for v in values)) or 1.0
    return [round(v / norm, 6) for v in values]


class Engine:
    """Runs generations and embeddings, keeping the scheduler's counters."""

    def __init__(self, spec: OllamaSpec, scheduler: Scheduler) -> None:
        self._spec = spec
        self._scheduler = scheduler

    def _rate(self, lease: Lease) -> float:
        return lease.runner.model.spec.tokens_per_second or self._spec.tokens_per_second

    async def complete(
        self, lease: Lease, prompt: str, options: RequestOptions
    ) -> AsyncIterator[Token | Finished]:
        """Yield tokens, then Finished; raise GenerationFailed on a simulated failure.

        Closing the iterator early (the client went away) counts as a cancellation.
        """
        counters = self._scheduler.counters
        steps = plan(prompt, options.num_predict, options.tokens)
        delay = 1.0 / self._rate(lease)
        loop = asyncio.get_running_loop()
        async with lease.runner.slots:
            counters.generations_started += 1
            self._scheduler.changed()
            outcome = "cancelled"
            try:
                began = loop.time()
                for index, token in enumerate(steps.tokens):
                    if options.fail_after_tokens is not None and index >= options.fail_after_tokens:
                        outcome = "failed"
                        raise GenerationFailed()
                    await asyncio.sleep(delay)
                    yield Token(token)
                eval_ns = int((loop.time() - began) * 1e9)
                outcome = "completed"
                yield Finished(
                    done_reason=steps.done_reason,
                    prompt_eval_count=steps.prompt_tokens,
                    prompt_eval_ns=max(1, steps.prompt_tokens * 1000),
                    eval_count=len(steps.tokens),
                    eval_ns=max(1, eval_ns),
                    context=context_ids(prompt + "".join(steps.tokens)),
                )
            finally:
                if outcome == "completed":
                    counters.generations_completed += 1
                elif outcome == "failed":
                    counters.generations_failed += 1
                else:
                    counters.generations_cancelled += 1
                self._scheduler.changed()

    async def embed(self, lease: Lease, texts: list[str]) -> tuple[list[list[float]], int]:
        """Vectors for `texts` and the prompt token count."""
        async with lease.runner.slots:
            dimensions = lease.runner.model.spec.embedding_length
            vectors = [embedding(text, dimensions) for text in texts]
            self._scheduler.counters.embeddings += 1
            self._scheduler.changed()
        return vectors, sum(len(_words(text)) + 1 for text in texts)
