"""Small builders for decision-core tests: observations, demands and a core on a fake clock."""

from __future__ import annotations

from gpugate.core.budget import usage_of
from gpugate.core.classes import PriorityClass, ResidencyPolicy
from gpugate.core.effects import Unload
from gpugate.core.observation import (
    GpuObservation,
    HostObservation,
    Owner,
    OwnerKind,
    ProcessUsage,
)
from gpugate.core.planner import PlannerSettings
from gpugate.core.pressure import ReserveSettings
from gpugate.core.residents import ResidentKey
from gpugate.core.state import CoreSettings, GateCore
from gpugate.core.tickets import Demand
from gpugate.core.units import GiB, MiB

TOTAL = 16 * GiB
RESERVED = 434 * MiB
RESERVE = 1 * GiB


def proc(pid: int, nbytes: int, owner: str, *, managed: bool = True) -> ProcessUsage:
    kind = OwnerKind.CONSUMER if managed else OwnerKind.EXTERNAL
    return ProcessUsage(pid, nbytes, Owner(kind, owner))


def gpu(
    *processes: ProcessUsage,
    index: int = 0,
    total: int = TOTAL,
    reserved: int = RESERVED,
    unattributed: int = 0,
) -> GpuObservation:
    used = sum(p.used or 0 for p in processes) + unattributed
    return GpuObservation(
        index=index,
        uuid=f"GPU-{index}",
        name="NVIDIA GeForce RTX 4080",
        total=total,
        reserved=reserved,
        used=used,
        free=total - reserved - used,
        processes=tuple(processes),
    )


def host(*devices: GpuObservation, at: float) -> HostObservation:
    return HostObservation(taken_at=at, wall_time=at, devices=tuple(devices))


def demand(
    model: str,
    envelope: int,
    *,
    priority: PriorityClass = PriorityClass.INTERACTIVE,
    resident_priority: PriorityClass | None = None,
    consumer: str = "ollama",
    options: str = "",
    policy: ResidencyPolicy = ResidencyPolicy.KEEP_WARM,
    ttl: float | None = 900.0,
    reload_seconds: float = 1.0,
    gpu_index: int = 0,
) -> Demand:
    return Demand(
        key=ResidentKey(consumer, model, options),
        gpu=gpu_index,
        envelope=envelope,
        priority=priority,
        resident_priority=resident_priority if resident_priority is not None else priority,
        policy=policy,
        idle_ttl=ttl,
        reload_seconds=reload_seconds,
    )


def make_core(
    *,
    reserve: int = RESERVE,
    reserve_max: int | None = None,
    max_wait: float = 60.0,
    queue_limit: int = 32,
    stale_after: float = 5.0,
    grace: float = 30.0,
    consumers: tuple[str, ...] = ("ollama",),
    reconcilable: tuple[str, ...] = ("ollama",),
    planner: PlannerSettings | None = None,
) -> GateCore:
    return GateCore(
        CoreSettings(
            reserve=ReserveSettings(reserve, reserve if reserve_max is None else reserve_max),
            max_wait={p: max_wait for p in PriorityClass},
            consumer_gpus={c: 0 for c in consumers},
            queue_limit={c: queue_limit for c in consumers},
            stale_after=stale_after,
            planner=PlannerSettings(equal_class_grace=grace) if planner is None else planner,
            reconcilable=frozenset(reconcilable),
        )
    )


class Card:
    """A core on one 16 GiB card for consumers `ollama` and `comfy`: Ollama's models loaded
    and idle, then samples on request of what `loaded`, `comfy` and `external` hold."""

    def __init__(
        self,
        *models: tuple[str, int, PriorityClass],
        external: int = 0,
        reserve: int = RESERVE,
        reserve_max: int | None = None,
    ) -> None:
        self.core = make_core(
            reserve=reserve, reserve_max=reserve_max, consumers=("comfy", "ollama")
        )
        self.now = 0.0
        self.external = external
        self.loaded: dict[str, int] = {}
        self.comfy = 0
        self.sample()
        for model, nbytes, klass in models:
            admission = self.core.submit(demand(model, nbytes, priority=klass), self.now)
            assert admission.lease is not None
            self.core.loaded(admission.lease.id, self.now)
            self.core.release(admission.lease.id, self.now)
            self.loaded[model] = nbytes
        self.sample()

    def sample(self):
        processes = [proc(100 + i, n, "ollama") for i, n in enumerate(self.loaded.values())]
        if self.comfy:
            processes.append(proc(300, self.comfy, "comfy"))
        if self.external:
            processes.append(proc(500, self.external, "plex", managed=False))
        return self.core.observe(host(gpu(*processes), at=self.now), self.now)

    def unloaded(self, unload: Unload):
        """An unload is done once a sample shows its bytes back, as the gate confirms it."""
        self.loaded.pop(unload.key.model, None)
        effects = self.sample()
        return [*effects, *self.core.unloaded(unload.key, self.now, reclaimed=True)]

    @property
    def schedulable(self) -> int:
        budget = self.core.budget(0)
        assert budget is not None
        return budget.schedulable


def unloads(effects) -> list[Unload]:
    return [e for e in effects if isinstance(e, Unload)]


# -- the state machines' card (test_core_properties, test_capacity, test_margin_properties)

WORLD_MODELS = (
    ("a", 1 * GiB, PriorityClass.BACKGROUND),
    ("b", 3 * GiB, PriorityClass.INTERACTIVE),
    ("c", 6 * GiB, PriorityClass.PRODUCTION),
    ("d", 8 * GiB, PriorityClass.BENCHMARK),
    ("e", 2 * GiB, PriorityClass.INTERACTIVE),
)
"""Five models a state machine asks for on one 16 GiB card: name, envelope, the class
its resident keeps."""


def world_sample(
    core: GateCore,
    runners: list[ProcessUsage],
    external: int,
    now: float,
    *,
    unattributed: int = 0,
) -> HostObservation:
    """A state machine's sample of its card: its runners' processes, one holding half of
    what the loading leases will hold (loads under way), and `external` bytes of Plex."""
    loading = sum(lease.pending // 2 for lease in core.leases() if lease.pending)
    processes = list(runners)
    if loading:
        processes.append(proc(99, loading, "ollama"))
    if external:
        processes.append(proc(500, external, "plex", managed=False))
    return host(gpu(*processes, unattributed=unattributed), at=now)


def assert_sums_recounted(core: GateCore) -> None:
    """The per-GPU sums the books carry from change to change are what a recount of their
    residents and leases gives (a drift would show as memory on its way back, or missing)."""
    books = core.books
    leases = list(books.leases.values())
    gpus = {0} | {r.gpu for r in books.residents.values()} | {x.gpu for x in leases}
    for gpu in sorted(gpus):
        carried = books.usage(gpu)
        assert carried == usage_of(gpu, books.residents.on_gpu(gpu), leases), gpu
