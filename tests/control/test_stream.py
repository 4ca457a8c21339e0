"""Live streams: the dashboard's feed and `GET /gate/v1/events?follow=1` with filters."""

from __future__ import annotations

import asyncio
import contextlib
import time

import aiohttp
import ollama
import pytest

from gpugate.core.effects import EventKind
from gpugate.core.failures import Failure, FailureClass
from tests.control.sse import sse_messages
from tests.gate.harness import running_stack


async def test_the_stream_sends_a_snapshot_at_once_then_coalesced_ones_and_each_event(
    tmp_path, sim_host, fakenvml_path
):
    async with (
        running_stack(tmp_path, sim_host, fakenvml_path) as stack,
        aiohttp.ClientSession() as session,
        session.get(stack.control_url + "/gate/v1/stream") as resp,
    ):
        assert resp.status == 200
        assert resp.headers["Content-Type"].startswith("text/event-stream")
        messages = sse_messages(resp)
        kind, first = await anext(messages)
        assert kind == "snapshot"
        assert first["gpus"][0]["total"] == stack.gate.core.budget(0).total
        assert first["pressure"] == {"0": False} and first["health"]["ok"] is True

        granted = stack.next_event(EventKind.LEASE_GRANTED, model="llama3.2:3b")
        client = ollama.AsyncClient(host=stack.gate_url)
        load = asyncio.create_task(client.generate("llama3.2:3b", "hi"))
        seen_event = None
        snapshots = []
        started = time.monotonic()
        async with asyncio.timeout(20):
            async for kind, data in messages:
                if kind == "event" and data["event"] == "lease_granted":
                    seen_event = data
                elif kind == "snapshot":
                    snapshots.append((time.monotonic(), data))
                    if seen_event and any(r["model"] == "llama3.2:3b" for r in data["residents"]):
                        break
        await load
        await granted
        assert seen_event["model"] == "llama3.2:3b" and seen_event["priority"] == "interactive"
        assert seen_event["time"] > time.time() - 60
        # Samples come every 200 ms and events in bursts: at most one snapshot per 250 ms.
        assert len(snapshots) <= (time.monotonic() - started) / 0.25 + 2
    assert stack.gate.core.leases() == [] and stack.gate.core.waiting() == []


async def test_follow_streams_only_the_events_asked_for(tmp_path, sim_host, fakenvml_path):
    async with running_stack(tmp_path, sim_host, fakenvml_path) as stack:
        client = ollama.AsyncClient(host=stack.gate_url)
        url = stack.control_url + "/gate/v1/events"
        async with (
            aiohttp.ClientSession() as session,
            session.get(url, params={"follow": "1", "failure": "*"}) as failures,
            session.get(
                url, params={"follow": "1", "consumer": "ollama", "class": "interactive"}
            ) as interactive,
            session.get(url, params={"follow": "1", "class": "background"}) as background,
        ):
            for resp in (failures, interactive, background):
                assert resp.status == 200
                assert resp.headers["Content-Type"].startswith("text/event-stream")
                await resp.content.readuntil(b"\n\n")  # the stream is open
            await client.generate("llama3.2:3b", "hi")
            kind, first = await anext(sse_messages(interactive))
            assert kind == "event" and first["consumer"] == "ollama"
            assert first["priority"] == "interactive"
            # A failure seen outside the core reaches the follower of failures.
            stack.gate.report(Failure(FailureClass.TIMEOUT, "TIMEOUT: a test", consumer="ollama"))
            async with asyncio.timeout(10):
                kind, failure = await anext(sse_messages(failures))
            assert kind == "event" and failure["failure"] == "TIMEOUT"
            assert failure["class"] == "TIMEOUT" and failure["event"] == "failure"
            # Nothing of class background happened: that stream has nothing but comments.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(0.5):
                    await anext(sse_messages(background))
                    raise AssertionError("a background event was streamed")

        async with (
            aiohttp.ClientSession() as session,
            session.get(url, params={"failure": "timeout"}) as resp,
        ):
            assert resp.headers["Content-Type"].startswith("application/x-ndjson")
            lines = (await resp.text()).splitlines()
        assert len(lines) == 1 and '"failure": "TIMEOUT"' in lines[0]
    assert stack.gate.core.leases() == [] and stack.gate.core.waiting() == []


async def test_a_resident_models_requests_are_followed_only_while_a_stream_is_open(
    tmp_path, sim_host, fakenvml_path
):
    async with running_stack(tmp_path, sim_host, fakenvml_path) as stack:
        client = ollama.AsyncClient(host=stack.gate_url)
        await client.generate("llama3.2:3b", "hi")  # loads it: the next request finds it
        hub = stack.gate.events
        assert hub.followers == 0  # nobody follows: a request's events are not built
        url = stack.control_url + "/gate/v1/events"
        async with (
            aiohttp.ClientSession() as session,
            session.get(url, params={"follow": "1", "consumer": "ollama"}) as resp,
        ):
            await resp.content.readuntil(b"\n\n")  # the stream is open
            assert hub.followers == 1
            await client.generate("llama3.2:3b", "hi")
            messages = sse_messages(resp)
            async with asyncio.timeout(10):
                granted = (await anext(messages))[1]
                released = (await anext(messages))[1]
        assert (granted["event"], granted["model"], granted["bytes"], granted["wait"]) == (
            "lease_granted",
            "llama3.2:3b",
            0,
            0.0,
        )
        assert (released["event"], released["reason"]) == ("lease_released", "done")
    assert hub.followers == 0


@pytest.mark.parametrize("follow", ["0", "1"])
@pytest.mark.parametrize(
    ("query", "said"),
    [({"failure": "NOPE"}, "unknown failure class 'NOPE'"), ({"class": "vip"}, "unknown class")],
)
async def test_a_filter_that_names_no_class_is_a_400(
    tmp_path, sim_host, fakenvml_path, follow, query, said
):
    async with (
        running_stack(tmp_path, sim_host, fakenvml_path) as stack,
        aiohttp.ClientSession() as session,
    ):
        for path in ("/gate/v1/events", "/gate/v1/stream"):
            params = {**query, "follow": follow}
            async with session.get(stack.control_url + path, params=params) as resp:
                assert resp.status == 400, path
                error = (await resp.json())["error"]
            assert error["class"] == "BAD_REQUEST" and said in error["message"]
        # Any case of a real class still filters.
        async with session.get(
            stack.control_url + "/gate/v1/events", params={"class": "Interactive"}
        ) as resp:
            assert resp.status == 200
