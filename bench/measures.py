"""What the client benchmarks measure with: a percentile of their samples, and the resident
memory of the process they load (the proxy under test)."""

from __future__ import annotations

from pathlib import Path


def percentile(values: list[float], q: float) -> float:
    """The `q` quantile of `values` (the sample at that rank); NaN for no samples."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def vm_rss(pid: int) -> int:
    """Process `pid`'s resident memory in bytes (VmRSS in /proc/PID/status)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for {pid}")
