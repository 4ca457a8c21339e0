"""One request's business with the gate: the listener asks once (`Requests.admit`,
requests.py) and is handed an `Exchange` that knows the request's leases, the headers its
answer carries, what to do with the answer's head and how it ends.

The listener knows no demand, lease scope or resident key: it reads and forwards bytes, and
tells the exchange what the runtime answered and how the forwarding ended.
"""

from __future__ import annotations

from typing import Protocol

import attrs

from gpugate.config.model import Identity
from gpugate.core.classes import PriorityClass
from gpugate.core.failures import Failure, FailureClass
from gpugate.core.placement import PlacementRule, Placing
from gpugate.core.residents import ResidentKey
from gpugate.core.tickets import Demand, Lease, LeaseScope
from gpugate.gate.admission import Leases
from gpugate.gate.jobs import JobWatch
from gpugate.gate.link import Link
from gpugate.identity import IdentityResolver, resolve_priority
from gpugate.runtimes.base import ApiFamily, Classified, RouteKind, failure_reply
from gpugate.runtimes.process import NotReady, ProcessExited
from gpugate.runtimes.process_ready import wait_ready
from gpugate.runtimes.replies import ErrorReply

LEASE_HEADER = "X-GPUGate-Lease"
WAIT_HEADER = "X-GPUGate-Wait"
FAILURE_HEADER = "X-GPUGate-Failure"
DEGRADED_HEADER = "X-GPUGate-Degraded"
"""On an answer whose lease is its floor (`gpugate.core.floors`):
`floor=<bytes>; ceiling=<bytes>; reason=<what the ceiling met>`."""
ERROR_BODY_LIMIT = 1024 * 1024
"""The most of a runtime's answer read before it goes down (a job's name, a load's error)."""
OOM_MARKERS = ("out of memory", "cudamalloc failed", "cuda_error_out_of_memory", "oom")


class ProcessFront(Protocol):
    """The process runtimes the gate starts, as a request sees them (starts.py)."""

    def fronts(self, link: Link) -> bool: ...

    def absent(self, link: Link) -> bool: ...

    async def settle(self, link: Link) -> bool: ...

    def stand_in(self, link: Link, method: str, path: str, api: ApiFamily) -> ErrorReply | None: ...

    async def running(self, link: Link) -> bool: ...

    async def serve_lease(self, link: Link, priority: PriorityClass) -> Lease: ...

    def switch_broke(self, link: Link) -> None: ...


class ExchangeOwner(Protocol):
    """The gate, as a request's exchange sees it: its leases, jobs and processes, and what
    the exchange reports to it."""

    leases: Leases
    jobs: JobWatch
    processes: ProcessFront

    def report(self, failure: Failure) -> None: ...

    def unload_asked(self, consumer: str) -> None: ...

    def withdraw(self, link: Link, job: str | None, demand: Demand) -> None: ...


@attrs.define
class Caller:
    """Who sent a request, as far as its class goes: identified only when a class is asked
    for (a request that passes untouched never is)."""

    identities: IdentityResolver
    remote: str | None
    authorization: str | None
    asked: str | None
    """The X-GPUGate-Priority header, if any."""
    _identity: Identity | None = attrs.field(default=None, init=False)
    _identified: bool = attrs.field(default=False, init=False)

    def priority(self, default: PriorityClass) -> PriorityClass:
        """The request's class: its identity's, else `default`, as the header may move it."""
        if not self._identified:
            self._identity = self.identities.identify(self.remote, self.authorization)
            self._identified = True
        return resolve_priority(self._identity, default, self.asked)


@attrs.frozen
class Trial:
    """A job forwarded before its lease, for the runtime to judge (`Vetted.runtime_decides`):
    the demand leased once the runtime has accepted it (`Demand.started` set), and where."""

    demand: Demand
    gpus: tuple[int, ...]
    placing: Placing
    rule: PlacementRule | None


@attrs.define
class Exchange:
    """A request admitted by the gate, from its admission to its end."""

    gate: ExchangeOwner
    link: Link
    classified: Classified
    method: str = ""
    path: str = ""
    refusal: ErrorReply | None = None
    """The runtime's own refusal, written by the gate: answer it, forward nothing."""
    lease: Lease | None = None
    """The request's lease for what it may load (a DEMAND), if it got one."""
    parts: tuple[Lease, ...] = ()
    """A load the runtime splits across GPUs: the leases of its parts on the GPUs after
    the first (`lease` is the first part's); they end as `lease` does."""
    busy: Lease | None = None
    """The 0-byte lease keeping a process runtime's process from eviction meanwhile."""
    caller: Caller | None = None
    """Who sent it: the class of a start it may need after its admission."""
    failed: bool = False
    kept: bool = False
    """The lease outlives the request: the runtime accepted a job or a start."""
    trial: Trial | None = None
    """A job forwarded with no lease, leased once the runtime has accepted it."""

    @property
    def api(self) -> ApiFamily:
        """The error shape the request's client parses."""
        return self.classified.api

    def headers(self) -> list[tuple[str, str]]:
        """The headers the gate adds to the runtime's answer."""
        lease = self.lease
        if lease is None:
            return []
        headers = [(LEASE_HEADER, str(lease.id)), (WAIT_HEADER, f"{lease.waited:.3f}")]
        degraded = lease.demand.degraded
        if degraded is not None:
            reason = degraded.reason.value
            value = f"floor={degraded.floor}; ceiling={degraded.ceiling}; reason={reason}"
            headers.append((DEGRADED_HEADER, value))
        return headers

    def wants_prefix(self, status: int) -> bool:
        """Whether the answer's first bytes must be read before it goes down: a job's
        answer names the job, a failed load's says why."""
        lease = self.lease
        if lease is None:
            # A job on trial: the answer names the job, to be withdrawn without a lease.
            return self.trial is not None and status < 400
        if status < 400:
            return lease.scope is LeaseScope.JOB
        return status >= 500 and lease.loads

    def answered(self, status: int, prefix: bytes = b"") -> list[tuple[str, str]]:
        """The runtime answered with `status` (and `prefix`, when `wants_prefix`): the
        books follow, and the headers for the answer come back."""
        reading = self.link.runtime.reading
        lifecycle = self.link.runtime.lifecycle
        if lifecycle is not None:
            lifecycle.answered(self.classified, status)
        lease = self.lease
        extra = self.headers()
        if lease is None:
            return extra
        gate = self.gate
        leases = gate.leases
        if reading.loaded_by(self.classified, status):
            leases.loaded(lease)
            for part in self.parts:
                leases.loaded(part)
            self.failed = False
            if lease.scope is LeaseScope.JOB:
                job = self._job_key(prefix)
                kind = ResidentKey(
                    self.link.consumer.name,
                    self.classified.model or "",
                    self.classified.options_key,
                )
                gate.jobs.started(lease, job, kind=kind, scale=self.classified.scale)
            self.kept = not leases.released_by_caller(lease)
        elif status >= 500 and lease.loads:
            if self.link.runtime.reading.refused_after_load(self.classified, status, prefix):
                # The runtime loaded the model and then refused the request itself (a
                # format or template it cannot use): resident, and no load failed.
                leases.loaded(lease)
                for part in self.parts:
                    leases.loaded(part)
                return extra
            failure = self._load_failure(status, prefix)
            gate.report(failure)
            extra.append((FAILURE_HEADER, failure.failure_class.value))
        else:
            self.failed = lease.pending > 0
        return extra

    async def accepted(self, status: int, prefix: bytes) -> None:
        """The runtime answered a job on trial: a refusal goes down as it is, with nothing
        leased; an acceptance is leased now, as any job is (evicting if need be), before the
        answer goes down. Raises GateFailure when it cannot be, with the job withdrawn from
        the runtime, so that nothing runs there without a lease."""
        trial, self.trial = self.trial, None
        if trial is None or status >= 400:
            return
        try:
            leases = await self.gate.leases.acquire_on(
                trial.demand, trial.gpus, placing=trial.placing, rule=trial.rule
            )
        except BaseException:
            # Its lease cannot be had, or its client left while it waited.
            self.gate.withdraw(self.link, self._job_key(prefix), trial.demand)
            raise
        if leases:
            self.lease, self.parts = leases[0], leases[1:]
        self.failed = any(lease.pending > 0 for lease in leases)

    def _job_key(self, answer: bytes) -> str | None:
        """The runtime's name for the job the request started, read from its answer."""
        jobs = self.link.runtime.jobs
        return None if jobs is None else jobs.job_key(self.classified, answer)

    @property
    def passes(self) -> bool:
        """Whether it goes up untouched, needing no lease of its own."""
        return self.classified.kind is RouteKind.PASS

    async def process_coming_up(self) -> bool:
        """The runtime refused the connection: True once its process answers, so the
        request may go up again; False when nothing is coming. Raises GateFailure when a
        start it needs cannot be had.

        * The books say the process is not there (the gate stopped it, is stopping or
          starting it, or it ended since this request was admitted, its end reported
          meanwhile): what a request arriving now meets (`Requests.admit`): a start
          under way is waited for, a stopped process is started for any request but its
          health route's. A lease this request held on the process that ended is
          released first.
        * A request that needs the process, which is there but not yet listening (a unit
          started it a moment ago: it loads before it binds): its port and health route,
          within its start timeout, or until the process ends (then as above)."""
        link = self.link
        control = link.consumer.control
        processes = self.gate.processes
        method, path = self.method, self.path
        if control is None or not processes.fronts(link):
            return False
        lifecycle = link.runtime.lifecycle
        if not processes.absent(link):
            if lifecycle is None or not lifecycle.needs_process(method, path):
                return False
            if not await processes.running(link):
                return False
            try:
                await wait_ready(
                    link.consumer.upstream.url,
                    control.health,
                    control.start_timeout,
                    process=lifecycle.control,
                )
            except NotReady:
                return False
            except ProcessExited:
                # It ended before it answered: its end is in the books now.
                if not processes.absent(link):
                    return False
            else:
                return True
        if not await processes.settle(link):
            return False
        if not processes.absent(link):
            return True
        if processes.stand_in(link, method, path, self.api) is not None:
            return False
        if self.busy is not None:
            busy, self.busy = self.busy, None
            self.gate.leases.release(busy)
        self.busy = await processes.serve_lease(link, self.process_priority())
        return True

    def process_priority(self) -> PriorityClass:
        """The class of a start of its runtime's process this request needs."""
        lifecycle = self.link.runtime.lifecycle
        model = lifecycle.process_model() if lifecycle is not None else None
        settings = self.link.runtime.settings
        default = settings.model_priority(model) if model else self.link.consumer.priority
        return self.caller.priority(default) if self.caller is not None else default

    def not_answering(self, exc: BaseException) -> ErrorReply:
        """The gate's answer when the runtime refused the connection, or closed it without
        an answer, and nothing is coming: for a switch of a process's model, its load
        failed (the runtime ends when the model does not load: its end is no crash); in
        place of a process the books say is not there, the health route's stand-in or a
        failure not reported again (the gate stopped it, or its end was reported once);
        otherwise a crash, reported."""
        link = self.link
        processes = self.gate.processes
        lease = self.lease
        if lease is not None and lease.demand.switch:
            processes.switch_broke(link)
            consumer = link.consumer
            what = (
                f"MODEL_LOAD_FAILED: {consumer.name} at {consumer.upstream.url}: it did not "
                f"answer the switch to {self.classified.model} ({exc.__class__.__name__}: {exc})"
            )
            return failure_reply(self.api, self._report(FailureClass.MODEL_LOAD_FAILED, what))
        if processes.fronts(link) and processes.absent(link):
            stood = processes.stand_in(link, self.method, self.path, self.api)
            if stood is not None:
                return stood
        return failure_reply(self.api, self.crashed(exc))

    def upstream_failed(self) -> None:
        """The runtime could not be reached or broke off: a load under the lease failed."""
        self.failed = True

    def finish(self) -> None:
        """The request is over: its leases end (unless kept), an unload is listed."""
        gate = self.gate
        if self.lease is not None and not self.kept:
            gate.leases.release_all((self.lease, *self.parts), failed=self.failed)
        if self.busy is not None:
            gate.leases.release(self.busy)
        if self.classified.kind is RouteKind.UNLOAD:
            gate.unload_asked(self.link.consumer.name)

    def timed_out(self, what: object) -> Failure:
        """The runtime did not answer in time: the failure, reported."""
        consumer = self.link.consumer
        return self._report(
            FailureClass.TIMEOUT, f"TIMEOUT: {consumer.name} at {consumer.upstream.url}: {what}"
        )

    def crashed(self, exc: BaseException) -> Failure:
        """The runtime is not answering: the failure, reported, unless the books say its
        process is not there (the gate stopped it or is starting it, or its end was
        reported when it exited): a deliberate stop is a state, not a crash."""
        consumer = self.link.consumer
        processes = self.gate.processes
        absent = processes.fronts(self.link) and processes.absent(self.link)
        what = "its process is not running" if absent else "it is not answering"
        message = (
            f"RUNTIME_CRASH: {consumer.name} at {consumer.upstream.url}: {what} "
            f"({exc.__class__.__name__}: {exc})"
        )
        if absent:
            return self._failure(FailureClass.RUNTIME_CRASH, message)
        return self._report(FailureClass.RUNTIME_CRASH, message)

    def _report(self, cls: FailureClass, message: str) -> Failure:
        failure = self._failure(cls, message)
        self.gate.report(failure)
        return failure

    def _failure(self, cls: FailureClass, message: str) -> Failure:
        consumer = self.link.consumer
        return Failure(
            cls, message, consumer=consumer.name, model=self.classified.model, gpu=consumer.cards[0]
        )

    def _load_failure(self, status: int, body: bytes) -> Failure:
        text = body.decode("utf-8", "replace")
        lowered = text.lower()
        oom = any(marker in lowered for marker in OOM_MARKERS)
        cls = FailureClass.GPU_OOM if oom else FailureClass.MODEL_LOAD_FAILED
        consumer = self.link.consumer
        return Failure(
            cls,
            f"{cls.value}: {consumer.name} answered {status} loading {self.classified.model}: "
            f"{text.strip()[:300]}",
            consumer=consumer.name,
            model=self.classified.model,
            gpu=consumer.cards[0],
        )
