"""`GET /gate/v1/health`: whether the gate runs on fresh data, one entry per check."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from gpugate.gate.signals import ConsumerHealth
from gpugate.runtimes.base import HealthSignal

if TYPE_CHECKING:
    from gpugate.gate.gate import Gate


def consumer_check(health: ConsumerHealth) -> dict[str, Any]:
    """One consumer's health check, named by its signal (`listing` for a listed runtime)."""
    check: dict[str, Any] = {
        "check": health.signal.value,
        "consumer": health.consumer,
        "signal": health.signal.value,
        "ok": health.ok,
        "fresh": health.fresh,
        "age_seconds": None if health.age is None else round(health.age, 3),
        "limit_seconds": None if health.limit is None else round(health.limit, 3),
    }
    if health.signal is HealthSignal.PROCESS:
        check["stopped"] = health.stopped
    return check


def health_document(gate: Gate) -> dict[str, Any]:
    """Is the gate running on fresh data? One entry per check, with ages and limits.

    NVML: each GPU's last good sample must be younger than `budget.stale_after`, and the
    driver must not be failing. Consumers: each one's own signal (its listing, its health
    route, its process) must have answered well within its bound; a consumer with no signal
    is shown and never fails. The store must be open and writing. Health recovers by itself
    as soon as the data is fresh again.
    """
    core = gate.core
    now = gate.clock()
    checks: list[dict[str, Any]] = [{"check": "started", "ok": gate.started}]
    fault = core.fault
    if fault is not None:
        checks.append({"check": "nvml", "ok": False, "error": fault.name, "message": fault.message})
    limit = gate.config.budget.stale_after
    gpus = core.gpus()
    if not gpus:
        checks.append({"check": "nvml", "ok": False, "age_seconds": None, "limit_seconds": limit})
    for gpu in gpus:
        age = core.sample_age(gpu, now)
        checks.append(
            {
                "check": "nvml",
                "gpu": gpu,
                "ok": age is not None and age <= limit,
                "age_seconds": None if age is None else round(age, 3),
                "limit_seconds": limit,
            }
        )
    for link in gate.links.values():
        checks.append(consumer_check(gate.signals.consumer_health(link, now)))
    store = gate.store
    if store is not None:
        # Admission does not wait on the store, but history, events and envelopes are not
        # being kept while it is down: an operator must see that here, not only in /metrics.
        checks.append(
            {
                "check": "store",
                "ok": store.healthy,
                "error": store.last_error,
                "buffered_records": store.buffered,
            }
        )
    ok = all(check["ok"] for check in checks)
    return {"ok": ok, "failed": [c["check"] for c in checks if not c["ok"]], "checks": checks}
