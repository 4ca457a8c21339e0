"""Launches: the core's Start and Wake carried out through a runtime's control, and reported."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
from collections.abc import Callable, Coroutine
from typing import Any

import attrs

from gpugate.core.effects import Start, Wake
from gpugate.core.failures import FailureClass
from gpugate.core.lifecycle import LifeReport
from gpugate.core.state import GateCore
from gpugate.gate.envelopes import cards_of
from gpugate.gate.failure import GateFailure
from gpugate.gate.link import Link
from gpugate.gate.process_books import LifeReports, ProcessBooks
from gpugate.gate.process_envelopes import ProcessEnvelopes
from gpugate.runtimes.base import Lifecycle
from gpugate.runtimes.footprint import Cap
from gpugate.runtimes.process import NotReady, ProcessExited
from gpugate.runtimes.process_ready import wait_ready
from gpugate.runtimes.process_supervised import SupervisedCommand

log = logging.getLogger("gpugate.starts")

Spawn = Callable[[Coroutine[Any, Any, None], str], asyncio.Task[None]]
"""Runs a coroutine as a task the starts keep (and cancel when the gate closes)."""


def _short(exc: BaseException) -> str:
    """An error in one line, without the runtime's own output (that goes to the gate's log)."""
    if isinstance(exc, ProcessExited):
        return f"the process exited before it was ready ({exc.exit.describe()})"
    return str(exc).splitlines()[0] if str(exc) else type(exc).__name__


def _output(exc: BaseException) -> str:
    """The runtime's last lines, for the gate's log line (one line)."""
    stderr = getattr(exc, "stderr", "") or ""
    lines = [x for x in stderr.splitlines() if x.strip()][-5:]
    return f"; its last output: {' | '.join(lines)}" if lines else ""


class ProcessLaunches:
    """The core's Start and Wake, carried out: started (or woken), waited on until it
    answers, reported UP or START_FAILED to the request that waits for it."""

    def __init__(
        self,
        core: GateCore,
        links: dict[str, Link],
        clock: Callable[[], float],
        reports: LifeReports,
        envelopes: ProcessEnvelopes,
        books: ProcessBooks,
        spawn: Spawn,
        failed: Callable[[Link], None],
    ) -> None:
        """`core` is read (lifecycles, leases, what NVML shows); what the lifecycle did goes
        to `reports`; `failed` is told of a start that failed (an always_warm process is
        started again after its backoff)."""
        self.core = core
        self.links = links
        self.clock = clock
        self.reports = reports
        self.envelopes = envelopes
        self.books = books
        self.spawn = spawn
        self.failed = failed
        self.outcomes: dict[str, asyncio.Future[None]] = {}
        """The start each consumer's waiting request awaits: done once reported."""
        self.last_failure: dict[str, str] = {}
        """Why each consumer's last start failed, in one line (cleared once it is up)."""

    def carry_out(self, effect: Start | Wake) -> None:
        """Carry out the core's Start or Wake through the runtime's lifecycle interface."""
        link = self.links.get(effect.consumer)
        lifecycle = link.runtime.lifecycle if link is not None else None
        if link is None or lifecycle is None or lifecycle.control is None:
            self.reports.life_report(effect.consumer, LifeReport.START_FAILED, "no control")
            return
        self.spawn(self._carry_out(link, lifecycle, effect), f"start-{effect.consumer}")

    async def _carry_out(self, link: Link, lifecycle: Lifecycle, effect: Start | Wake) -> None:
        process = lifecycle.control
        assert process is not None
        name = link.consumer.name
        control = link.consumer.control
        health = control.health if control is not None else "/health"
        timeout = control.start_timeout if control is not None else 60.0
        started = self.clock()
        outcome = self.outcomes.pop(name, None)
        self.envelopes.starting(name)
        waking = isinstance(effect, Wake)
        try:
            if waking:
                await process.wake()
            else:
                devices = self._devices(effect.lease) if len(link.consumer.cards) > 1 else None
                cap = self._cap(link, lifecycle, effect.lease)
                await process.start(devices=devices, cap=cap)
                if cap is not None and isinstance(process, SupervisedCommand):
                    _told(name, process, cap)
            await wait_ready(link.consumer.upstream.url, health, timeout, process=process)
        except Exception as exc:
            if not waking:
                with contextlib.suppress(Exception):
                    await process.stop()
                lifecycle.process_ended()
            verb = "wake" if waking else "start"
            self.reports.life_report(
                name, LifeReport.START_FAILED, f"its {verb} failed: {_short(exc)}"
            )
            retry = self.core.start_wait(name, self.clock())
            cls = FailureClass.TIMEOUT if isinstance(exc, NotReady) else FailureClass.RUNTIME_CRASH
            what = f"its {verb} failed: {_short(exc)}"
            what += f"; next start in {math.ceil(retry)}s at the earliest"
            failure = attrs.evolve(self.books.failure(link, cls, what), retry_after=retry)
            log.warning("%s could not be %s: %s%s", name,
                        "woken" if waking else "started", _short(exc), _output(exc))  # fmt: skip
            self.last_failure[name] = what
            self.reports.report(failure)
            self.failed(link)
            if outcome is not None and not outcome.done():
                outcome.set_exception(GateFailure(failure))
            return
        except BaseException:
            if outcome is not None and not outcome.done():
                outcome.cancel()
            raise
        lease = self.core.lease(effect.lease)
        if lease is not None:
            self.envelopes.started(lease.key)
        self.reports.life_report(name, LifeReport.UP)
        self.last_failure.pop(name, None)
        log.info(
            "%s %s under lease %d (%.1fs to ready)",
            name, "woken" if waking else "started", effect.lease, self.clock() - started,
        )  # fmt: skip
        if outcome is not None and not outcome.done():
            outcome.set_result(None)

    def _cap(self, link: Link, lifecycle: Lifecycle, lease_id: int) -> Cap | None:
        """What the runtime is told of the most its start lease lets it take (its memory
        part's knob: a single-model llama-server's `-c`); None where it has none."""
        lease = self.core.lease(lease_id)
        if lease is None:
            return None
        model = lifecycle.process_model()
        nbytes, cards = lease.demand.envelope, cards_of(self.core, link.consumer)
        return link.runtime.memory.cap(model, nbytes, cards)

    def _devices(self, lease_id: int) -> str | None:
        """CUDA_VISIBLE_DEVICES for a start on the GPU its lease was placed on: the GPU's
        UUID (the same card whatever order CUDA counts in), else its index."""
        lease = self.core.lease(lease_id)
        if lease is None:
            return None
        observation = self.core.observation(lease.gpu)
        if observation is not None and observation.uuid:
            return observation.uuid
        return str(lease.gpu)


def _told(name: str, process: SupervisedCommand, cap: Cap) -> None:
    """Log the cap a started command was told, or the operator's own setting it kept."""
    if process.kept is not None:
        log.info("%s: started with its own %s (the gate's cap, %s, not added)",
                 name, process.kept, " ".join(cap.args))  # fmt: skip
    elif cap.args:
        log.info("%s: started with %s, the most its lease lets it take", name,
                 " ".join(cap.args))  # fmt: skip
