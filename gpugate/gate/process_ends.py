"""How a process runtime's end is taken: a crash, or the end of a switch of its model.

* **A crash** (a supervised child's exit, an adopted one's end, while the books say it is
  up) is one RUNTIME_CRASH event and counts for its start backoff; its resident goes.
* **An end while switching its model**: a runtime may end when the model a request asks
  it to load does not load (whisper-server's /load of a file that opens but is no model:
  server.cpp frees its model, fails, `exit(1)`, unanswered). The gate knows a switch is
  under way (its lease is open), or that the runtime left one unanswered (the request's
  connection closed: `broke`), and takes the end that follows as the request's doing:
  stopped, not failing, no backoff (its next start loads the model it started with), and
  the request reports the failed load (MODEL_LOAD_FAILED) instead of a crash. Until the
  process has ended, a request waits for its end (`wait_for_end`) rather than meet a
  process on its way out.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from gpugate.core.failures import FailureClass
from gpugate.core.lifecycle import LifeReport, LifeState
from gpugate.core.state import GateCore
from gpugate.gate.link import Link
from gpugate.gate.process_books import LifeReports, ProcessBooks, control_of
from gpugate.gate.process_envelopes import ProcessEnvelopes
from gpugate.runtimes.process import Exit

log = logging.getLogger("gpugate.starts")


class ProcessEnds:
    """What the gate makes of a process runtime's end."""

    def __init__(
        self,
        core: GateCore,
        books: ProcessBooks,
        envelopes: ProcessEnvelopes,
        reports: LifeReports,
        restart: Callable[[Link], None],
    ) -> None:
        """`core` is read (the lifecycle); what the lifecycle did goes to `reports`."""
        self.core = core
        self.books = books
        self.envelopes = envelopes
        self.reports = reports
        self.restart = restart
        """Start it again if its residency says so (always_warm), after its backoff."""
        self._broke: set[str] = set()
        """Consumers whose process left a switch of its model unanswered: its next end is
        that switch's, not a crash."""

    def broke(self, link: Link) -> None:
        """A request that switched the process's model got no answer: the end that follows
        is that request's doing (`LifeReport.ENDED_SWITCHING`)."""
        self._broke.add(link.consumer.name)

    def starting(self, consumer: str) -> None:
        """A new start: whatever ended before is over."""
        self._broke.discard(consumer)

    async def wait_for_end(self, link: Link) -> None:
        """Wait, within the control timeout, for the end of a process that left a switch of
        its model unanswered: a request meanwhile would reach a process on its way out. One
        that lives on past the timeout did not end for the switch."""
        name = link.consumer.name
        process = control_of(link)
        ended = process.ended() if process is not None and name in self._broke else None
        if ended is None or ended.done():
            return
        try:
            async with asyncio.timeout(link.consumer.timeouts.control):
                await asyncio.shield(ended)
        except TimeoutError:
            self._broke.discard(name)

    def exited(self, link: Link, exit: Exit) -> None:
        """A process the gate runs ended on its own: one crash event (a start that fails
        reports its own), its resident and start lease end, always_warm starts again. One
        that ended switching its model (a switch under way, or one it left unanswered) is
        no crash: stopped, with no backoff; the switch's request reports the failed load."""
        name = link.consumer.name
        switching = name in self._broke or self.books.switching(link)
        self._broke.discard(name)
        if link.runtime.lifecycle is not None:
            link.runtime.lifecycle.process_ended()
        self.envelopes.ended(name)
        life = self.core.lifecycle(name)
        if life is not None and life.state is LifeState.STARTING:
            return  # its start reports its own failure
        if exit.stderr_tail:
            log.warning("%s exited (%s); its last output: %s", name, exit.describe(),
                        " | ".join(exit.stderr_tail[-5:]))  # fmt: skip
        if switching:
            what = f"its process ended switching its model: {exit.describe()}"
            self.reports.life_report(name, LifeReport.ENDED_SWITCHING, what)
        else:
            ended = f"its process ended: {exit.describe()}"
            self.reports.life_report(name, LifeReport.EXITED, ended)
            what = f"it exited: {exit.describe()}"
            self.reports.report(self.books.failure(link, FailureClass.RUNTIME_CRASH, what))
        self.restart(link)
