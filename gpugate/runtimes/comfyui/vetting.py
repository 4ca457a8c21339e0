"""ComfyUI's own refusal of a prompt, decided before any lease from ComfyUI's node catalog.

ComfyUI validates a prompt before it queues it (execution.py `validate_prompt`) and answers
400 with its `node_errors` when no output is valid: nothing loads. The gate applies the same
validation (comfyui_validation.py) to the catalog ComfyUI serves at `GET /object_info`, so a
prompt ComfyUI will refuse gets ComfyUI's own answer and nobody's model is evicted for it.

The catalog is fetched once and kept; it is fetched whole again after `CATALOG_TTL`
(custom nodes change only when ComfyUI restarts, and its process then gets a new catalog),
and class by class before a refusal that may come from a stale file list is trusted
(ComfyUI lists its model folders again when it validates). The files the LoadImage family
names are asked about anew for every prompt (input_files.py).

The outcome is one of three: ComfyUI will queue it (leased as usual), ComfyUI will refuse
it with this body (the gate answers it), or only ComfyUI can tell or word it (a node whose
validation is its own code, a cycle, a traceback): the adapter then has it forwarded with
no lease, leased only once ComfyUI has accepted it. A catalog that cannot be fetched only
means the prompt is admitted unvetted. This is ComfyUI's `Vetting` part, with
`validate_prompts` on.
"""

from __future__ import annotations

import json
import urllib.parse

import aiohttp

from gpugate.runtimes.answers import AdapterError, Classified, Vetted
from gpugate.runtimes.comfyui.catalog import Catalog, parse_object_info
from gpugate.runtimes.comfyui.graph import PromptDemand
from gpugate.runtimes.comfyui.input_files import files_present, named_files
from gpugate.runtimes.comfyui.validation import Outcome, Verdict, classes_to_refetch, validate
from gpugate.runtimes.parts import Vetting
from gpugate.runtimes.replies import ErrorReply

CATALOG_TTL = 300.0
"""Seconds a whole catalog is trusted before the next prompt fetches it again."""
CONTENT_TYPE = "application/json; charset=utf-8"


class CatalogError(AdapterError):
    """ComfyUI did not answer `/object_info` with a catalog."""


class PromptVetting(Vetting):
    """One ComfyUI's catalog, and the verdict of its validation on a prompt."""

    def __init__(self, base_url: str, bound: float) -> None:
        self.base_url = base_url
        self.timeout = aiohttp.ClientTimeout(total=bound)
        """Each call to ComfyUI is bounded (the consumer's `timeouts.control`)."""
        self.catalog: Catalog | None = None
        self.fetched_at = float("-inf")

    async def vet(
        self, classified: Classified, session: aiohttp.ClientSession, now: float
    ) -> Vetted | None:
        """ComfyUI's own 400 for a prompt it will refuse, from its node catalog and its
        files; a prompt only ComfyUI can judge (or word the refusal of) is leased only
        once ComfyUI has accepted it."""
        demand = classified.reading
        if not isinstance(demand, PromptDemand):
            return None
        verdict = await self.verdict(demand, session, now)
        if verdict.outcome is Outcome.QUEUE:
            return None
        if verdict.outcome is Outcome.REFUSE and verdict.exact:
            return Vetted(ErrorReply(400, verdict.body, CONTENT_TYPE))
        return Vetted(runtime_decides=True)

    async def verdict(
        self, demand: PromptDemand, session: aiohttp.ClientSession, now: float
    ) -> Verdict:
        """What ComfyUI will answer the prompt, as far as the gate can tell. Raises
        CatalogError or aiohttp's errors when ComfyUI does not answer as it should (the
        caller admits the prompt then)."""
        if self.catalog is None or now - self.fetched_at > CATALOG_TTL:
            self.catalog = await self._fetch(session, "/object_info")
            self.fetched_at = now
        catalog = self.catalog
        files = await self._files(demand, catalog, session)
        verdict = validate(demand.prompt, catalog, demand.targets, files)
        fresh: set[str] = set()
        while verdict.outcome is Outcome.REFUSE:
            stale = classes_to_refetch(verdict, fresh)
            if not stale:
                break
            for name in sorted(stale):
                path = "/object_info/" + urllib.parse.quote(name, safe="")
                catalog = catalog.refreshed([name], await self._fetch(session, path))
            fresh |= stale
            self.catalog = catalog
            files = await self._files(demand, catalog, session)
            verdict = validate(demand.prompt, catalog, demand.targets, files)
        return verdict

    async def refusal(
        self, demand: PromptDemand, session: aiohttp.ClientSession, now: float
    ) -> ErrorReply | None:
        """ComfyUI's 400 for a prompt it will refuse, when the gate can write it; None
        otherwise."""
        verdict = await self.verdict(demand, session, now)
        if verdict.outcome is Outcome.REFUSE and verdict.exact:
            return ErrorReply(400, verdict.body, CONTENT_TYPE)
        return None

    async def _files(
        self, demand: PromptDemand, catalog: Catalog, session: aiohttp.ClientSession
    ) -> dict[str, bool]:
        names = named_files(demand.prompt, catalog)
        if not names:
            return {}
        return await files_present(session, self.base_url, names, self.timeout)

    async def _fetch(self, session: aiohttp.ClientSession, path: str) -> Catalog:
        async with session.get(self.base_url + path, timeout=self.timeout) as resp:
            if resp.status != 200:
                raise CatalogError(f"{path} answered {resp.status}")
            raw = await resp.read()
        try:
            # json.loads as ComfyUI wrote it: its values are echoed back in refusals.
            answer = json.loads(raw)
        except (UnicodeDecodeError, ValueError) as exc:
            raise CatalogError(f"{path} answered something that is not JSON: {exc}") from None
        if not isinstance(answer, dict):
            raise CatalogError(f"{path} answered something that is not an object")
        return parse_object_info(answer)
