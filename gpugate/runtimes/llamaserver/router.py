"""llama-server in router mode (`--models-dir`, `--models-preset`): many GGUF models, each
run by a child llama-server the router spawns on demand and stops on `/models/unload`.

What decides its parts (tools/server/server-models.cpp):

* Every proxied route (reading.py) loads the model it names before it runs, unless
  `?autoload=false` or `--no-models-autoload` (then a model not running is refused, 400):
  a DEMAND for that model. A name the router does not know (400 "model 'x' not found"),
  a body it cannot parse (500) or an empty name (400) pass unleased for it to refuse.
* `POST /models/load` answers at once and loads in the background: its lease is held
  until the model's child shows its memory (PROCESS scope), as a start's is. It is leased
  whatever a listing said of the model a moment ago: the books decide (a model they hold
  costs a 0-byte lease, and the router answers 400 `model is already running`), never a
  cached listing, which the router's own unloads leave behind
  (`post_router_models_load`: `is_running`, else `load`).
* `POST /models/unload` frees a model: the child exits. The gate's evictions use it, and
  a client's passes as an UNLOAD for the books to follow.
* `--models-max N` (its `/props` `max_instances`): at N running models (loaded, loading,
  sleeping, or stopping until the child exits) the router unloads its least recently
  used idle one before it loads another (`load` → `unload_lru`; a request that autoloads:
  `ensure_model_ready` → `server_lru_sched::tick`). The gate makes that room itself
  (`Residents.most_models`, gpugate/core/crowding.py): it evicts one of the consumer's
  models with `/models/unload` and waits until the router no longer lists it, so the
  router finds a free slot and unloads nothing of its own accord, and the books stay what
  it holds.
* `GET /models` lists every model with its status; the loaded ones are the residents.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping

import aiohttp

from gpugate.config.model import Consumer
from gpugate.core.tickets import LeaseScope
from gpugate.runtimes.answers import (
    ApiFamily,
    Classified,
    HealthSignal,
    LoadedModel,
    NotSupported,
    ReclaimRule,
    Refusal,
    RouteKind,
    Screening,
    Vetted,
)
from gpugate.runtimes.dialect import ServerDialect
from gpugate.runtimes.footprint import Cap, Cards, Elasticity, Footprint
from gpugate.runtimes.health import RouteHealth
from gpugate.runtimes.keepalive import LLAMA_HTTPLIB
from gpugate.runtimes.llamaserver.catalog import Catalog, LlamaServerError, parse_models
from gpugate.runtimes.llamaserver.memory import context_cap, footprint
from gpugate.runtimes.llamaserver.reading import (
    LOAD,
    UNLOAD,
    Unreadable,
    is_proxied,
    named_model,
    routed,
)
from gpugate.runtimes.llamaserver.replies import LLAMA_BODY_LIMIT, llama_screening
from gpugate.runtimes.parts import Inventory, Memory, Reading, Residents, Vetting
from gpugate.runtimes.runtime import ModelSettings, Runtime

CATALOG_TTL = 2.0
"""Seconds a listing answers a request's question about a model before it is asked again."""
WARM_POLL = 0.1
"""Seconds between two reads of the listing while a model the gate warms again loads."""


class RouterState:
    """What the gate knows of one router: its catalog, as last listed, with its
    `--models-max` and autoload. Shared by the router's reading, vetting, listing,
    residents and estimates."""

    def __init__(self, settings: ModelSettings) -> None:
        self.settings = settings
        self.catalog = Catalog()
        self.listed_at = float("-inf")
        self.models_max: int | None = None
        """`--models-max` as the router's /props says it (`max_instances`); None: unread."""
        self.autoload = True

    def canonical(self, name: str | None) -> str | None:
        """A model's own name for a name or alias the router knows; other names as written."""
        if not name:
            return None
        entry = self.catalog.resolve(name)
        return entry.name if entry is not None else name

    async def refresh(self, session: aiohttp.ClientSession, now: float) -> Catalog:
        """Read the router's listing (and, once, its `--models-max` from /props)."""
        async with session.get(self.settings.url("/models")) as resp:
            if resp.status != 200:
                raise LlamaServerError(f"/models answered {resp.status}")
            try:
                data = await resp.json(content_type=None)
            except ValueError as exc:
                raise LlamaServerError(
                    f"/models answered something that is not JSON: {exc}"
                ) from exc
        self.catalog = parse_models(data)
        self.listed_at = now
        if self.models_max is None:
            await self._read_props(session)
        return self.catalog

    async def _read_props(self, session: aiohttp.ClientSession) -> None:
        async with session.get(self.settings.url("/props")) as resp:
            if resp.status != 200:
                return
            try:
                props = await resp.json(content_type=None)
            except ValueError:
                return
        if isinstance(props, dict) and props.get("role") == "router":
            limit = props.get("max_instances")
            self.models_max = limit if isinstance(limit, int) else 0
            self.autoload = props.get("models_autoload") is not False
        else:
            self.models_max = 0


class RouterReading(Reading):
    """Which of a router's requests load a model, and which model."""

    dialect = ServerDialect.HTTPLIB
    # cpp-httplib closes an idle connection after 5 s and after 100 requests (as
    # whisper-server's): the listener reuses one only well inside both, so a request is
    # never sent on a connection the server may be closing; the gate's own calls open one
    # each (aiohttp's client keeps an idle connection 15 s). It ends the connection after
    # every streamed answer: that one is never reused (keepalive.py `LLAMA_HTTPLIB`).
    keep_alive = LLAMA_HTTPLIB
    body_limit = LLAMA_BODY_LIMIT

    def __init__(self, state: RouterState) -> None:
        self.state = state

    def screen(self, method: str, headers: Mapping[str, str], *, target: str = "") -> Screening:
        return llama_screening(headers)

    def wants_body(self, method: str, path: str) -> bool:
        return method == "POST" and (is_proxied(method, path) or path in (LOAD, UNLOAD))

    def classify(
        self, method: str, path: str, body: bytes | None, content_type: str, *, query: str = ""
    ) -> Classified:
        api = ApiFamily.LLAMA
        state = self.state
        if method == "POST" and path == UNLOAD:
            model = state.canonical(named_model(body))
            return (
                Classified(RouteKind.UNLOAD, api, model)
                if model
                else Classified(RouteKind.PASS, api)
            )
        if method == "POST" and path == LOAD:
            model = state.canonical(named_model(body))
            if not model:
                return Classified(RouteKind.PASS, api)
            return Classified(
                RouteKind.DEMAND,
                api,
                model,
                scope=LeaseScope.PROCESS,
                appear_within=state.settings.consumer.timeouts.control * 4,
            )
        if not is_proxied(method, path):
            return Classified(RouteKind.PASS, api)
        try:
            request = routed(method, body, query)
        except Unreadable as exc:
            return Classified(RouteKind.REFUSE, api, refusal=Refusal(400, str(exc)))
        if request is None:
            return Classified(RouteKind.PASS, api)
        entry = state.catalog.resolve(request.model)
        model = entry.name if entry is not None else request.model
        return Classified(
            RouteKind.DEMAND,
            api,
            model,
            idle_ttl=state.settings.residency(model).idle_ttl,
            reading=request.autoload,
        )


class RouterVetting(Vetting):
    """A model the router does not know, or may not load (autoload off), goes up unleased
    for the router to refuse (400): nothing loads for it. A `/models/load` of a model it
    knows is always leased: whether the model runs is the books' to say."""

    def __init__(self, state: RouterState) -> None:
        self.state = state

    async def vet(
        self, classified: Classified, session: aiohttp.ClientSession, now: float
    ) -> Vetted | None:
        model = classified.model
        if model is None:
            return None
        state = self.state
        # The router's own clock: its listing times come from it too (listing()).
        moment = time.monotonic()
        entry = state.catalog.resolve(model)
        if entry is None or moment - state.listed_at > CATALOG_TTL:
            await state.refresh(session, moment)
            entry = state.catalog.resolve(model)
        if entry is None:
            return Vetted()
        if classified.scope is LeaseScope.PROCESS:
            return None
        autoload = classified.reading if isinstance(classified.reading, bool) else state.autoload
        if not autoload and not entry.running:
            return Vetted()
        return None


class RouterInventory(Inventory):
    """The models whose children are loaded."""

    def __init__(self, state: RouterState) -> None:
        self.state = state

    async def listing(self, session: aiohttp.ClientSession) -> list[LoadedModel]:
        """The router says no sizes: the books keep what each model's lease counted; one
        loaded behind the gate's back counts its configured envelope, else the estimate
        from its GGUF header."""
        catalog = await self.state.refresh(session, time.monotonic())
        settings = self.state.settings
        loaded = []
        for entry in catalog.entries:
            if entry.status == "loaded":
                size = settings.configured_envelope(entry.name)
                if size is None:
                    found = footprint(entry.option("-m", "--model"), entry.option)
                    size = found.ceiling if found is not None else 0
                loaded.append(LoadedModel(entry.name, size, size, sized=False))
        return loaded


class RouterResidents(Residents):
    """A model's child exits when it is unloaded; NVML may show part of its memory late."""

    reclaim_rule = ReclaimRule(recovered_fraction=0.75)

    def __init__(self, state: RouterState) -> None:
        self.state = state
        self.settings = state.settings

    @property
    def most_models(self) -> int | None:
        """`--models-max` once read (0, unlimited, or unread: None)."""
        return self.state.models_max if self.state.models_max else None

    async def evict(self, session: aiohttp.ClientSession, model: str) -> None:
        """`POST /models/unload`: the router stops the model's child. A model no longer
        running is already what the eviction wants."""
        async with session.post(self.settings.url(UNLOAD), json={"model": model}) as resp:
            text = await resp.text()
            if resp.status == 200 or (resp.status == 400 and "not running" in text):
                return
            raise LlamaServerError(f"unload of {model} answered {resp.status}: {text[:200]}")

    def evict_timeout(self) -> float:
        return self.settings.consumer.timeouts.control

    warms = True

    async def warm(self, session: aiohttp.ClientSession, model: str, ttl: float | None) -> None:
        """`POST /models/load`, then the router's listing until the model is `loaded`: the
        router answers the load at once and starts the child in the background
        (`post_router_models_load`), so its answer does not say the model is in memory;
        its listing does. A model already running is what the load wants. The router has
        no keep_alive: the gate unloads it at its ttl. Raises LlamaServerError when the
        model is not known or its child did not load (`unloaded` again)."""
        async with session.post(self.settings.url(LOAD), json={"model": model}) as resp:
            text = await resp.text()
            if resp.status != 200 and not (resp.status == 400 and "already running" in text):
                raise LlamaServerError(f"load of {model} answered {resp.status}: {text[:200]}")
        while True:
            entry = (await self.state.refresh(session, time.monotonic())).resolve(model)
            if entry is None:
                raise LlamaServerError(f"the router does not list {model}")
            if entry.status == "loaded":
                return
            if entry.status != "loading":
                raise LlamaServerError(f"{model} did not load: the router says {entry.status}")
            await asyncio.sleep(WARM_POLL)

    def warm_timeout(self) -> float:
        # The child loads the model before it answers its health route: a first byte's time.
        return self.settings.consumer.timeouts.first_byte


class RouterMemory(Memory):
    """A router's model: its child's load, from its file and the arguments the router's
    listing shows it starts with (memory.py)."""

    elasticity = Elasticity.FITTED
    knob = "-c (in the model's preset), --fit-target"

    def __init__(self, state: RouterState) -> None:
        super().__init__(state.settings)
        self.state = state

    async def estimate(
        self, session: aiohttp.ClientSession, model: str, options: str, cards: Cards
    ) -> Footprint | None:
        """None when the router does not know the model; NotSupported when its file
        cannot be read."""
        entry = self.state.catalog.resolve(model)
        if entry is None:
            entry = (await self.state.refresh(session, time.monotonic())).resolve(model)
        if entry is None:
            return None
        found = footprint(entry.option("-m", "--model"), entry.option)
        if found is None:
            raise NotSupported(f"{model}: the gate cannot read its file to size it")
        return found

    def cap(self, model: str, nbytes: int, cards: Cards) -> Cap | None:
        entry = self.state.catalog.resolve(model)
        if entry is None:
            return None
        return context_cap(entry.option("-m", "--model"), entry.option, nbytes)


def router_runtime(consumer: Consumer) -> Runtime:
    """One llama-server router behind the gate: listed, vetted and sized by its catalog;
    `GET /health` answers 200 once it serves."""
    settings = ModelSettings(consumer)
    state = RouterState(settings)
    return Runtime(
        settings=settings,
        reading=RouterReading(state),
        residents=RouterResidents(state),
        health=RouteHealth(HealthSignal.LISTING, settings.url("/health")),
        vetting=RouterVetting(state),
        inventory=RouterInventory(state),
        memory=RouterMemory(state),
    )
