"""The gate and a listener serve a runtime they know only through its parts.

The runtime here exists only in this test, registered by name as a runtime package would
register itself (what builds it in `registry.RUNTIMES`, its own configuration section in
`sections.SECTIONS`): nothing in config/, core/, gate/ or proxy/ knows it. It queues jobs (a
POST answers at once with the job's id, the work runs later), so its demands have JOB
scope. The lease outlives the HTTP call and ends on the job's event.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

import aiohttp
import attrs
import pytest
from aiohttp import web

from gpugate.config.loader import load_config_text
from gpugate.config.model import Consumer, RuntimeSettings
from gpugate.core.scopes import JOBS_MODEL
from gpugate.core.tickets import LeaseScope
from gpugate.core.units import GiB
from gpugate.gate.exchange import LEASE_HEADER
from gpugate.gate.gate import Gate
from gpugate.gpu.sampler import Sampler
from gpugate.identity import IdentityResolver
from gpugate.proxy.listener import ConsumerListener
from gpugate.runtimes.base import (
    ApiFamily,
    Classified,
    Health,
    HealthSignal,
    JobEnd,
    Jobs,
    ModelSettings,
    NotSupported,
    Reading,
    Residents,
    RouteKind,
    Runtime,
)
from gpugate.runtimes.registry import RUNTIMES, runtime_for
from gpugate.runtimes.sections import SECTIONS
from tests.gate.fakes import FakeAttributor, FakeGpu


@attrs.frozen
class QueueSettings(RuntimeSettings):
    """The runtime's own section (`queue:`)."""

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
        jobs=QueueJobs(),
    )


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
async def stack(aiohttp_server, aiohttp_raw_server, aiohttp_client, tmp_path: Path, monkeypatch):
    monkeypatch.setitem(SECTIONS, "queue", QueueSettings)
    monkeypatch.setitem(RUNTIMES, "queue", queue_runtime)
    seen: list[Mapping[str, object]] = []
    server = await aiohttp_server(upstream_app(seen))
    url = f"http://127.0.0.1:{server.port}"
    config = load_config_text(CONFIG.format(url=url), tmp_path / "consumers.yaml")
    assert config.consumer("queue").settings == QueueSettings(job_path="/prompt")
    gate = Gate(config, Sampler(FakeGpu(), FakeAttributor()), runtimes=runtime_for)
    await gate.start()
    link = gate.links["queue"]
    listener = ConsumerListener(gate, link, IdentityResolver(config.identities))
    client = await aiohttp_client(await aiohttp_raw_server(listener.handle))
    try:
        yield gate, client, seen
    finally:
        await listener.close()
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
