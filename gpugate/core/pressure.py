"""External pressure: a reserve that grows with external volatility, and hysteresis.

The gate cannot stop Plex from growing; it can keep enough headroom that Plex's next
burst does not land on a model load, and give idle memory back when the headroom is
eaten. Both react to samples only: time is the sample's time.
"""

from __future__ import annotations

from collections import deque

import attrs

from gpugate.core.units import MiB, format_duration, format_gib


@attrs.frozen
class ReserveSettings:
    base: int
    """The reserve with calm external use."""
    ceiling: int
    """The most the reserve grows to."""
    window: float = 600.0
    """How far back an external peak still counts."""
    clear_margin: int = 256 * MiB
    """Pressure ends only when this much is schedulable again (hysteresis)."""
    settle: float = 5.0
    """How long after an unload was confirmed what NVML shows outside the consumers may
    still be its memory on the way back (the gate gives an unload `reclaim_timeout`)."""


@attrs.define
class ExternalHistory:
    """External bytes over the last window, to size the reserve of one GPU."""

    settings: ReserveSettings
    _samples: deque[tuple[float, int]] = attrs.field(factory=deque)

    def observe(self, now: float, external: int) -> None:
        self._samples.append((now, external))
        horizon = now - self.settings.window
        while self._samples and self._samples[0][0] < horizon:
            self._samples.popleft()

    def reserve(self) -> int:
        """Base reserve plus how far external use may rebound to its recent peak."""
        return self.why().reserve

    def why(self) -> ReserveWhy:
        """The reserve with what it is made of: its base, the rebound, the ceiling."""
        if not self._samples:
            return ReserveWhy(self.settings, 0, 0)
        current = self._samples[-1][1]
        peak = max(external for _, external in self._samples)
        return ReserveWhy(self.settings, peak, current)


@attrs.frozen
class ReserveWhy:
    """Why a GPU's reserve is what it is: the base, plus how far external use may rebound
    to its peak within the window (as the memory it used then may come back), up to the
    ceiling. The peak sees no memory of the consumers in motion (`gpugate.core.motion`)."""

    settings: ReserveSettings
    peak: int
    """The most external use of the window."""
    current: int
    """External use in the last sample."""

    @property
    def rebound(self) -> int:
        return max(0, self.peak - self.current)

    @property
    def reserve(self) -> int:
        return min(self.settings.ceiling, self.settings.base + self.rebound)

    @property
    def capped(self) -> bool:
        return self.settings.base + self.rebound > self.settings.ceiling

    def line(self) -> str:
        """One line: 'base 1.0 GiB + 2.0 GiB external use may rebound ...'."""
        base = f"base {format_gib(self.settings.base)}"
        window = format_duration(self.settings.window)
        if not self.rebound:
            return f"{base}: external use is at its peak of the last {window}"
        rebound = (
            f"{base} + {format_gib(self.rebound)} external use may rebound (from "
            f"{format_gib(self.current)} to its peak of {format_gib(self.peak)} in the last "
            f"{window})"
        )
        if self.capped:
            return f"{rebound}, capped at reserve_max {format_gib(self.settings.ceiling)}"
        return rebound


@attrs.define
class PressureGauge:
    """Over-committed or not, with hysteresis so one noisy sample does not flap."""

    clear_margin: int
    active: bool = False

    def update(self, schedulable: int) -> bool | None:
        """Feed the latest schedulable bytes; True on entering pressure, False on leaving."""
        if not self.active and schedulable < 0:
            self.active = True
            return True
        if self.active and schedulable >= self.clear_margin:
            self.active = False
            return False
        return None
