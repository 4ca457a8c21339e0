"""The latest NVML view of every GPU, and what follows from it: reserve, pressure, budget."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from gpugate.core.books import Books
from gpugate.core.budget import GpuBudget, budget_of, unexplained_of
from gpugate.core.motion import external_for_reserve
from gpugate.core.observation import DriverFault, GpuObservation, HostObservation
from gpugate.core.overrun import OverrunWatch
from gpugate.core.pressure import ExternalHistory, PressureGauge, ReserveSettings, ReserveWhy


class Telemetry:
    """Per-GPU samples as the core last saw them. Changed only by `observe`."""

    def __init__(
        self,
        reserve: ReserveSettings,
        reserve_by_gpu: dict[int, ReserveSettings] | None = None,
        consumer_gpus: Mapping[str, int | tuple[int, ...]] | None = None,
    ) -> None:
        self._reserve = reserve
        self._reserve_by_gpu = dict(reserve_by_gpu or {})
        self.consumer_gpus = {
            name: (cards,) if isinstance(cards, int) else tuple(cards)
            for name, cards in (consumer_gpus or {}).items()
        }
        self.observations: dict[int, GpuObservation] = {}
        self.observed_at: dict[int, float] = {}
        self.fault: DriverFault | None = None
        self.unexplained: dict[int, dict[str, int]] = {}
        self._history: dict[int, ExternalHistory] = {}
        self._settling: dict[int, list[tuple[float, int]]] = {}
        """Per GPU, (until, bytes) of unloads confirmed a moment ago whose last bytes may
        still be on their way back (`gpugate.core.motion`)."""
        self.pressure: dict[int, PressureGauge] = {}
        self.overruns = OverrunWatch()
        """Consumers holding more than their leases (`gpugate.core.overrun`)."""

    def reserve_settings(self, gpu: int) -> ReserveSettings:
        return self._reserve_by_gpu.get(gpu, self._reserve)

    def unexplained_card(self, consumer: str, cards: Sequence[int]) -> int:
        """Of `cards`, the one where the last samples show the most of `consumer`'s memory
        that the books do not explain (something of it loaded unseen); the first when none."""
        return max(
            cards, key=lambda g: (self.unexplained.get(g, {}).get(consumer, 0), -cards.index(g))
        )

    def observe(self, sample: HostObservation, books: Books) -> list[int]:
        """Take a sample in; returns the GPUs it updated."""
        if sample.error is not None:
            self.fault = sample.error
            return []
        self.fault = None
        updated = []
        for device in sample.devices:
            gpu = device.index
            self.observations[gpu] = device
            self.observed_at[gpu] = sample.taken_at
            history = self._history.setdefault(gpu, ExternalHistory(self.reserve_settings(gpu)))
            settling = self.settling(gpu, sample.taken_at)
            history.observe(
                sample.taken_at, external_for_reserve(device, books.usage(gpu), settling)
            )
            self.explain(gpu, books)
            updated.append(gpu)
        return updated

    def explain(self, gpu: int, books: Books) -> None:
        """Recompute what the last sample shows beyond the books (after either changed)."""
        observation = self.observations.get(gpu)
        if observation is not None:
            self.unexplained[gpu] = unexplained_of(observation, books.usage(gpu))

    def unloaded(self, gpu: int, nbytes: int, now: float) -> None:
        """An unload on `gpu` was confirmed at `now`: for the reserve's settle time, up to
        `nbytes` NVML shows outside the consumers are still its memory on the way back."""
        if nbytes > 0:
            until = now + self.reserve_settings(gpu).settle
            self._settling.setdefault(gpu, []).append((until, nbytes))

    def settling(self, gpu: int, at: float) -> int:
        """Bytes of unloads confirmed within the settle time before `at`."""
        rows = self._settling.get(gpu)
        if not rows:
            return 0
        rows[:] = [(until, nbytes) for until, nbytes in rows if until >= at]
        return sum(nbytes for _, nbytes in rows)

    def absorb(self, gpu: int, consumer: str, nbytes: int) -> None:
        """A grant now explains `nbytes` of what the last sample showed of `consumer` beyond
        the books (a job's own early allocations, `gpugate.core.early`)."""
        rows = self.unexplained.get(gpu)
        if rows is None or consumer not in rows:
            return
        left = rows[consumer] - nbytes
        if left > 0:
            rows[consumer] = left
        else:
            del rows[consumer]

    def reserve(self, gpu: int) -> int:
        history = self._history.get(gpu)
        return history.reserve() if history else self.reserve_settings(gpu).base

    def reserve_why(self, gpu: int) -> ReserveWhy:
        """Why the GPU's reserve is what it is (`gpugate.core.pressure.ReserveWhy`)."""
        history = self._history.get(gpu)
        return history.why() if history else ReserveWhy(self.reserve_settings(gpu), 0, 0)

    def sample_age(self, gpu: int, now: float) -> float | None:
        at = self.observed_at.get(gpu)
        return None if at is None else max(0.0, now - at)

    def budget(self, gpu: int, books: Books) -> GpuBudget | None:
        observation = self.observations.get(gpu)
        if observation is None:
            return None
        return budget_of(
            observation,
            books.usage(gpu),
            sampled_at=self.observed_at[gpu],
            reserve=self.reserve(gpu),
            unexplained=self.unexplained.get(gpu, {}),
            consumers=[c for c, cards in self.consumer_gpus.items() if gpu in cards],
        )

    def gauge(self, gpu: int) -> PressureGauge:
        return self.pressure.setdefault(gpu, PressureGauge(self.reserve_settings(gpu).clear_margin))
