"""What runs already: a process runtime found before the gate starts it.

Before a start the gate asks the runtime's control what it is (`probe`): up, asleep or
stopped. One that looks stopped may still be there: a process running the control's very
command (an earlier gate's child outlives it), or one listening on the upstream's port
(started by hand; whisper-server binds with SO_REUSEPORT, so a second instance would bind
too). Such a process is adopted (stopped by signal, its end watched through a pidfd),
never started twice. A unit's own command line is read first: it names the model.
"""

from __future__ import annotations

import asyncio
import logging
from urllib.parse import urlsplit

from gpugate.core.failures import FailureClass
from gpugate.core.lifecycle import LifeReport
from gpugate.core.tickets import Lease
from gpugate.gate.admission import Leases
from gpugate.gate.failure import GateFailure
from gpugate.gate.link import Link
from gpugate.gate.process_books import LifeReports, ProcessBooks, control_of
from gpugate.runtimes.process import ProcessControl, ProcessControlError
from gpugate.runtimes.process_find import listening_pids
from gpugate.runtimes.process_ready import port_open, wait_ready
from gpugate.runtimes.process_systemd import SystemdUnit

log = logging.getLogger("gpugate.starts")


class ProcessFinder:
    """Finds, reads and adopts a process runtime that runs outside the gate's own start."""

    def __init__(self, leases: Leases, books: ProcessBooks, reports: LifeReports) -> None:
        self.leases = leases
        self.books = books
        self.reports = reports

    async def found(self, link: Link, process: ProcessControl) -> LifeReport:
        """What the runtime is now, as its lifecycle records it: up (the control's own, one
        running its command, or one serving its port: adopted, never started twice),
        asleep, or stopped."""
        found = await self._found_as(link, process)
        self.reports.life_report(link.consumer.name, found)
        return found

    async def _found_as(self, link: Link, process: ProcessControl) -> LifeReport:
        found = await self._probe(link, process)
        if found is not LifeReport.FOUND_STOPPED or not process.owns_port:
            return found
        pid = process.find()
        how = "runs its command"
        if pid is None:
            pid = await self._listener(link)
            how = "listens on its port"
        if pid is None:
            return found
        try:
            process.adopt(pid)
        except ProcessControlError as exc:
            log.warning(
                "%s: process %d %s but cannot be adopted: %s", link.consumer.name, pid, how, exc
            )
            return LifeReport.FOUND_UP
        log.warning(
            "%s: process %d %s; adopted instead of starting another", link.consumer.name, pid, how
        )
        return LifeReport.FOUND_UP

    async def _listener(self, link: Link) -> int | None:
        """A process listening on the upstream's port, if one can be seen."""
        url = urlsplit(link.consumer.upstream.url)
        if url.port is None or url.hostname is None:
            return None
        # A refused connection says nothing listens, at once; the scan of /proc/net/tcp
        # costs tens of milliseconds where many closed connections wait out TIME_WAIT.
        if not await port_open(url.hostname, url.port):
            return None
        found = listening_pids(url.port)
        return found[0] if found else None

    async def adopted_ready(self, link: Link, process: ProcessControl, lease: Lease) -> None:
        """An adopted process may still be loading its model (whisper-server binds once it
        holds it): it is resident once its port accepts. Its health route is not waited
        for: after a /load that failed it stays unwell, and the runtime answers for itself."""
        control = link.consumer.control
        timeout = control.start_timeout if control is not None else 60.0
        try:
            await wait_ready(link.consumer.upstream.url, None, timeout, process=process)
        except ProcessControlError as exc:
            self.leases.release(lease, failed=True)
            failure = self.books.failure(link, FailureClass.RUNTIME_CRASH, f"adopted, then: {exc}")
            self.reports.report(failure)
            raise GateFailure(failure) from exc
        self.reports.process_ready(lease)

    async def read_unit(self, link: Link) -> None:
        """What a unit runs is its own command line, not the configuration's guess: read
        it (its model) before it is started or adopted. Unreadable: the guess stands."""
        lifecycle = link.runtime.lifecycle
        process = lifecycle.control if lifecycle is not None else None
        if lifecycle is None or not isinstance(process, SystemdUnit):
            return
        try:
            argv = await process.command()
        except ProcessControlError as exc:
            log.warning("%s: the command line of its unit is unknown: %s", link.consumer.name, exc)
            return
        if argv:
            lifecycle.read_unit_command(argv)

    async def running(self, link: Link) -> bool:
        """Whether the consumer's process is there (its control says so), bounded."""
        process = control_of(link)
        if process is None:
            return False
        try:
            async with asyncio.timeout(link.consumer.timeouts.control):
                return await process.is_running()
        except (TimeoutError, ProcessControlError):
            return False

    async def _probe(self, link: Link, process: ProcessControl) -> LifeReport:
        try:
            return await process.probe()
        except Exception as exc:
            what = f"its state is unknown: {exc}"
            raise GateFailure(self.books.failure(link, FailureClass.RUNTIME_CRASH, what)) from exc
