"""The gate and a listener serve a runtime they know only through its parts.

The runtime here exists only in this test: a registry of its own (the shipped runtimes and
this one, built from its parts, with its own configuration section) is handed to the loader and
the gate, as `serve` hands them the shipped one; no table of the package changes, and
nothing in config/, core/, gate/ or proxy/ knows it. It queues jobs (a POST answers at once
with the job's id, the work runs later), so its demands have JOB scope. The lease outlives
the HTTP call and ends on the job's event; `preempt` applies to it, and what the loader says
of runtimes and job runtimes names it.
"""

from __future__ import annotations

import io
import json
from collections.abc import Mapping
from pathlib import Path
from typing import ClassVar

import aiohttp
import attrs
import pytest
from aiohttp import web

from gpugate.config.check import EXIT_INVALID, EXIT_OK, run_check
from gpugate.config.loader import ConfigError, load_config_text
from gpugate.config.model import Consumer, RuntimeSettings
from gpugate.core.classes import PriorityClass
from gpugate.core.job_leases import JOBS_MODEL
from gpugate.core.tickets import LeaseScope
from gpugate.core.units import GiB
from gpugate.gate.exchange import LEASE_HEADER
from gpugate.gate.gate import Gate
from gpugate.gpu.sampler import Sampler
from gpugate.identity import IdentityResolver
from gpugate.proxy.listener import ConsumerListener
from gpugate.proxy.runners import ListenerRunner
from gpugate.runtimes.base import (
    ApiFamily,
    Classified,
    Health,
    HealthSignal,
    JobEnd,
    Jobs,
    Memory,
    ModelSettings,
    NotSupported,
    Reading,
    Residents,
    RouteKind,
    Runtime,
)
from gpugate.runtimes.registry import RUNTIMES, RuntimeRegistry
from gpugate.runtimes.sections import RUNTIME_TABLE
from tests.gate.fakes import FakeAttributor, FakeGpu


@attrs.frozen
class QueueSettings(RuntimeSettings):
    """The runtime's own section (`queue:`)."""

    jobs: ClassVar[bool] = True

    job_path: str = "/jobs"
    """The route that queues a job."""


class QueueReading(Reading):
    """POST to its job path starts a job; every other request passes."""

    def __init__(self, consumer: Consumer) -> None:
        self.job_path = consumer.settings_as(QueueSettings).job_path

    def wants_body(self, method: str, path: str) -> bool:
        return method == "POST" and path == self.job_path

    def classify(
        self, method: str, path: str, body: bytes | None, content_type: str, *, query: str = ""
    ) -> Classified:
        if not self.wants_body(method, path) or body is None:
            return Classified(RouteKind.PASS, ApiFamily.PLAIN)
        return Classified(RouteKind.DEMAND, ApiFamily.PLAIN, "workflow", scope=LeaseScope.JOB)


class QueueJobs(Jobs):
    """Its answer names the job; it never says on its own that one ended (the test sends
    the job's end), and cannot stop one."""

    def job_key(self, classified: Classified, body: bytes) -> str | None:
        return str(json.loads(body)["prompt_id"])

    async def track_jobs(
        self, session: aiohttp.ClientSession, live: frozenset[str]
    ) -> list[JobEnd]:
        return []

    async def preempt(self, session: aiohttp.ClientSession, job: str) -> None:
        raise NotSupported("no job can be stopped")


class QueueResidents(Residents):
    """/free gives memory back."""

    def __init__(self, settings: ModelSettings) -> None:
        self.settings = settings

    async def evict(self, session: aiohttp.ClientSession, model: str) -> None:
        async with session.post(self.settings.url("/free"), json={"free_memory": True}) as resp:
            resp.raise_for_status()

    def evict_timeout(self) -> float:
        return self.settings.consumer.timeouts.control


class QueueHealth(Health):
    """Nothing says it is well: it never fails the gate's health."""

    signal = HealthSignal.UNOBSERVED

    async def check(self, session: aiohttp.ClientSession) -> bool:
        raise NotSupported("no health route")


def queue_runtime(consumer: Consumer) -> Runtime:
    """A runtime that queues work, built from its parts; it has no listing."""
    settings = ModelSettings(consumer)
    return Runtime(
        settings=settings,
        reading=QueueReading(consumer),
        residents=QueueResidents(settings),
        health=QueueHealth(),
        memory=Memory(settings),
        jobs=QueueJobs(),
    )


QUEUE = RUNTIMES.adding("queue", queue_runtime, QueueSettings)
"""The shipped runtimes and this one."""


def upstream_app(seen: list[Mapping[str, object]]) -> web.Application:
    async def prompt(request: web.Request) -> web.Response:
        body = await request.json()
        seen.append(body)
        if body.get("bad"):
            return web.json_response({"error": "invalid prompt"}, status=400)
        return web.json_response({"prompt_id": f"p{len(seen)}", "number": len(seen)})

    async def other(request: web.Request) -> web.Response:
        return web.Response(text="ok")

    app = web.Application()
    app.router.add_post("/prompt", prompt)
    app.router.add_get("/other", other)
    return app


CONFIG = """\
gate:
  control: 127.0.0.1:1
budget:
  reserve: 1GiB
  sample_interval: 50ms
  stale_after: 5s
consumers:
  queue:
    runtime: queue
    queue: {{job_path: /prompt}}
    listen: 127.0.0.1:2
    processes: {{commands: [queue-server]}}
    upstream: {url}
    class: interactive
    models:
      workflow: {{envelope: 3GiB}}
"""


@pytest.fixture
async def stack(aiohttp_server, tmp_path: Path):
    seen: list[Mapping[str, object]] = []
    server = await aiohttp_server(upstream_app(seen))
    url = f"http://127.0.0.1:{server.port}"
    source = tmp_path / "consumers.yaml"
    config = load_config_text(CONFIG.format(url=url), source, runtimes=QUEUE.table)
    assert config.consumer("queue").settings == QueueSettings(job_path="/prompt")
    gate = Gate(config, Sampler(FakeGpu(), FakeAttributor()), runtimes=QUEUE.runtime_for)
    await gate.start()
    link = gate.links["queue"]
    listener = ConsumerListener(gate, link, IdentityResolver(config.identities))
    consumer = link.consumer
    runner = ListenerRunner(
        listener.handle, listener.dialect, listener.close, consumer.limits, "queue", 64
    )
    await runner.start("127.0.0.1", 0)
    port = runner.addresses[0][1]
    client = aiohttp.ClientSession(base_url=f"http://127.0.0.1:{port}")
    try:
        yield gate, client, seen
    finally:
        await client.close()
        await runner.cleanup()
        await gate.close()


async def test_a_job_lease_outlives_its_request_until_the_job_ends(stack):
    gate, client, seen = stack
    assert isinstance(gate.links["queue"].runtime.reading, QueueReading)
    async with client.post("/prompt", json={"prompt": {}}) as resp:
        assert resp.status == 200
        assert await resp.json() == {"prompt_id": "p1", "number": 1}
        lease_id = int(resp.headers[LEASE_HEADER])
    # The HTTP call is over; the job is not: its lease and its consumer's job lease stay.
    [job] = gate.jobs.live("queue")
    assert job.id == lease_id and job.scope is LeaseScope.JOB
    carriers = [x for x in gate.core.leases() if x.key.model == JOBS_MODEL]
    assert [x.pending for x in carriers] == [3 * GiB]
    gate.jobs.finished("queue", "p1")
    assert gate.core.leases() == []
    assert gate.core.waiting() == []
    assert len(seen) == 1


async def test_a_job_the_runtime_refuses_ends_with_its_request(stack):
    gate, client, seen = stack
    async with client.post("/prompt", json={"bad": True}) as resp:
        assert resp.status == 400
        assert await resp.json() == {"error": "invalid prompt"}
    assert seen == [{"bad": True}]
    assert gate.core.leases() == []
    assert gate.jobs.live("queue") == []


async def test_requests_that_demand_nothing_pass_without_a_lease(stack):
    gate, client, _ = stack
    async with client.get("/other") as resp:
        assert resp.status == 200
        assert LEASE_HEADER not in resp.headers
    assert gate.core.leases() == []


async def test_a_runtime_that_cannot_list_is_not_listed(stack):
    gate, _, _ = stack
    assert not any(t.get_name().startswith("gpugate-reconcile") for t in gate._tasks)
    assert "queue" not in gate.core.settings.reconcilable


def check(tmp_path: Path, text: str) -> tuple[int, list[str]]:
    """`gpugate check` of `text` with the registry's table: its exit code and its lines."""
    path = tmp_path / "consumers.yaml"
    path.write_text(text)
    out, err = io.StringIO(), io.StringIO()
    code = run_check(path, out, err, runtimes=QUEUE.table)
    return code, [line.removeprefix(f"{path}:") for line in err.getvalue().splitlines()]


def consumer(name: str, runtime: str, port: int, *lines: str) -> str:
    """A consumer of `runtime` on its own port, with more `key: value` lines."""
    more = "".join(f"    {line}\n" for line in lines)
    return (
        f"  {name}:\n    runtime: {runtime}\n    listen: 127.0.0.1:{port}\n"
        f"    upstream: http://127.0.0.1:{port + 1}\n"
        f"    processes: {{commands: [{name}-server]}}\n{more}"
    )


def test_the_shipped_runtimes_are_not_changed_by_another_registry(tmp_path: Path):
    assert QUEUE.table.names == (*RUNTIME_TABLE.names, "queue")
    assert RUNTIMES.table == RUNTIME_TABLE and "queue" not in RUNTIMES.factories
    text = "consumers:\n" + consumer("q", "queue", 8000)
    with pytest.raises(ConfigError) as info:
        load_config_text(text, tmp_path / "consumers.yaml", runtimes=RUNTIME_TABLE)
    [error] = info.value.errors
    assert (error.line, error.path) == (3, "consumers.q.runtime")
    assert error.message.startswith("unknown runtime 'queue' (one of ollama, comfyui, ")


def test_a_registry_fronts_only_runtimes_its_table_names():
    with pytest.raises(ValueError, match=r"^runtimes not in the table: queue$"):
        RuntimeRegistry(RUNTIME_TABLE, {**RUNTIMES.factories, "queue": queue_runtime})
    with pytest.raises(ValueError, match="'queue' is in the table twice"):
        QUEUE.adding("queue", queue_runtime, QueueSettings)


def test_check_names_it_among_the_runtimes(tmp_path: Path):
    text = "consumers:\n" + consumer("sd", "sdnext", 8000) + consumer("n", "3", 8010)
    code, lines = check(tmp_path, text)
    runtimes = "ollama, comfyui, whisper, llama-server, vllm, http, queue"
    assert code == EXIT_INVALID
    assert lines == [
        f"3: consumers.sd.runtime: unknown runtime 'sdnext' (one of {runtimes})",
        f"8: consumers.n.runtime: expected a runtime ({runtimes}), got 3 (a number)",
    ]


def test_preempt_applies_to_it_as_a_runtime_with_jobs(tmp_path: Path):
    text = "consumers:\n" + consumer("q", "queue", 8000, "preempt: [production]")
    code, lines = check(tmp_path, text)
    assert (code, lines) == (EXIT_OK, [])
    config = load_config_text(text, tmp_path / "c.yaml", runtimes=QUEUE.table)
    assert config.consumer("q").preempt == (PriorityClass.PRODUCTION,)


def test_preempt_elsewhere_names_it_among_the_job_runtimes(tmp_path: Path):
    text = "consumers:\n" + consumer("o", "ollama", 8000, "preempt: [production]")
    code, lines = check(tmp_path, text)
    assert code == EXIT_OK
    assert lines == [
        "7: consumers.o.preempt: warning: only a comfyui or queue consumer reads preempt; "
        "runtime ollama ignores it"
    ]


def test_its_section_is_its_own(tmp_path: Path):
    text = "consumers:\n" + consumer("o", "ollama", 8000, "job_path: /x", "queue: {}")
    code, lines = check(tmp_path, text)
    assert code == EXIT_OK
    assert lines == [
        "7: consumers.o.job_path: warning: only a queue consumer reads job_path; "
        "runtime ollama ignores it",
        "8: consumers.o.queue: warning: only a queue consumer reads a queue section; "
        "runtime ollama ignores it",
    ]
