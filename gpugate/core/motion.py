"""What of a sample's external memory is the gate's own consumers in motion.

The reserve grows with how far external use may rebound (`gpugate.core.pressure`), so its
history must see only memory that belongs neither to the consumers nor to their loads,
unloads and starts. NVML's rows do not always say whose bytes are moving:

* a runner being unloaded leaves NVML's process list before the driver has its memory
  back, so for a sample its bytes are used memory no process accounts for
  (`unattributed`); a process that exits between NVML's list and the read of its
  `/proc` entry is a process nobody claims (`other`);
* a process starting, or a load, can hold memory before NVML lists it under its process;
* what an unload leaves after the gate confirmed it (the reclaim rule asks for 75 % of
  the bytes back, `gate/unloads.py`) can stay in the driver's hands a little longer;
* work under an explicit lease runs in a process no consumer's rule matches (`other`).

Counted as external, each of these reads as external volatility: the history's peak
rises with the gate's own eviction and the reserve stays raised for its whole window
(600 s), shrinking what every later demand may have. So the unattributed and unclaimed
bytes of a sample, up to what the books have in motion that NVML does not show under its
consumer, are the gate's own and not external for the reserve. Configured external
services are never the gate's: their rows are taken as NVML gives them.
"""

from __future__ import annotations

from gpugate.core.budget import GpuUsage
from gpugate.core.observation import OTHER, UNATTRIBUTED, GpuObservation


def in_motion(observation: GpuObservation, usage: GpuUsage, settling: int = 0) -> int:
    """Bytes the books have moving on this GPU (residents unloading, leases not yet
    loaded or started) that the sample does not show under their consumer, plus
    `settling`: what unloads confirmed a moment ago may still hold."""
    observed = observation.managed
    moving = 0
    for name in set(usage.unloading) | set(usage.pending):
        counted = usage.resident.get(name, 0) + usage.pending.get(name, 0)
        missing = max(0, counted - observed.get(name, 0))
        moving += min(missing, usage.unloading.get(name, 0) + usage.pending.get(name, 0))
    return moving + settling


def external_for_reserve(observation: GpuObservation, usage: GpuUsage, settling: int = 0) -> int:
    """The sample's external bytes the reserve's history takes: every configured
    service's, and of the unattributed and unclaimed rows what the gate's own memory in
    motion does not account for."""
    external = observation.external
    loose = external.get(UNATTRIBUTED, 0) + external.get(OTHER, 0)
    named = sum(external.values()) - loose
    return named + max(0, loose - in_motion(observation, usage, settling))
