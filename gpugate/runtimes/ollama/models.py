"""What Ollama says of its installed models (`POST /api/show`), kept for a while.

A request's model decides some of Ollama's refusals (ollama_needs.py); the gate asks
Ollama once per model and keeps the answer for `FACTS_TTL`, so a request pays for a
`/api/show` only the first time its model is seen in that window. A model Ollama does not
have gets no facts: the sizing step answers for it (no lease, Ollama's own 404).
"""

from __future__ import annotations

from typing import Any

import aiohttp

from gpugate.runtimes.base import AdapterError
from gpugate.runtimes.ollama.needs import ModelFacts

FACTS_TTL = 60.0
"""Seconds a model's capabilities are trusted (they change only when it is pulled again)."""
FRESH = 1.0
"""How old an answer may be for a refusal to rest on it: a model pulled a moment ago is
seen, and a client asking for names that are not there makes one listing a second."""
FACTS_LIMIT = 4096
"""Models remembered at once; past it the oldest answer is dropped."""


class ModelFactsCache:
    """One Ollama's answers to `/api/show`, by model."""

    def __init__(self, url: str, headers: dict[str, str], bound: float) -> None:
        self.url = url
        self.headers = headers
        self.timeout = aiohttp.ClientTimeout(total=bound)
        """Each call to Ollama is bounded (the consumer's `timeouts.control`)."""
        self._facts: dict[str, tuple[ModelFacts | None, float]] = {}
        self._installed: tuple[frozenset[str], float] | None = None

    async def facts(
        self, session: aiohttp.ClientSession, model: str, now: float, *, max_age: float = FACTS_TTL
    ) -> ModelFacts | None:
        """The model's capabilities and whether it is a remote stub; None: not installed.
        `max_age`: how old an answer may be (a refusal is trusted only on a fresh one)."""
        known = self._facts.get(model)
        if known is not None and now - known[1] <= max_age:
            return known[0]
        facts = await self._show(session, model)
        if len(self._facts) >= FACTS_LIMIT:
            self._facts.pop(next(iter(self._facts)))
        self._facts[model] = (facts, now)
        return facts

    async def installed(
        self, session: aiohttp.ClientSession, now: float, *, max_age: float = FACTS_TTL
    ) -> frozenset[str]:
        """The names of the installed models as Ollama lists them (`/api/tags`), at most
        `max_age` seconds old."""
        if self._installed is not None and now - self._installed[1] <= max_age:
            return self._installed[0]
        tags = await self._json(
            session.get(self.url + "/api/tags", headers=self.headers, timeout=self.timeout)
        )
        entries = tags.get("models") if isinstance(tags, dict) else None
        names = frozenset(
            str(entry.get("name") or entry.get("model"))
            for entry in (entries if isinstance(entries, list) else [])
            if isinstance(entry, dict)
        )
        self._installed = (names, now)
        return names

    async def _show(self, session: aiohttp.ClientSession, model: str) -> ModelFacts | None:
        request = session.post(
            self.url + "/api/show",
            json={"model": model},
            headers=self.headers,
            timeout=self.timeout,
        )
        show = await self._json(request, missing=True)
        if show is None:
            return None
        if not isinstance(show, dict):
            raise AdapterError("/api/show answered something that is not an object")
        capabilities = show.get("capabilities")
        if not isinstance(capabilities, list):
            capabilities = []
        remote = show.get("remote_host")
        details = show.get("details")
        families = details.get("families") if isinstance(details, dict) else None
        info = show.get("model_info")
        arch = info.get("general.architecture") if isinstance(info, dict) else None
        return ModelFacts(
            frozenset(c for c in capabilities if isinstance(c, str)),
            remote=isinstance(remote, str) and bool(remote),
            retired=isinstance(families, list)
            and "mllama" in families
            and bool(show.get("projector_info")),
            layers=info_count(info.get(f"{arch}.block_count"))
            if isinstance(info, dict) and isinstance(arch, str)
            else 0,
        )

    def known(self, model: str) -> ModelFacts | None:
        """The last answer for `model`, however old (None: never asked, or not installed)."""
        known = self._facts.get(model)
        return None if known is None else known[0]

    @staticmethod
    async def _json(request: Any, *, missing: bool = False) -> Any:
        """The JSON answer of a call to Ollama; None for a 404 when `missing` is allowed."""
        async with request as resp:
            if missing and resp.status == 404:
                return None
            if resp.status != 200:
                raise AdapterError(f"{resp.url.path} answered {resp.status}")
            try:
                return await resp.json(content_type=None)
            except ValueError as exc:
                raise AdapterError(f"{resp.url.path} answered something not JSON: {exc}") from None


def info_count(value: object) -> int:
    """A positive count from model_info (a per-layer list counts as its largest)."""
    if isinstance(value, list):
        value = max((v for v in value if type(v) is int), default=0)
    return value if type(value) is int and value > 0 else 0
