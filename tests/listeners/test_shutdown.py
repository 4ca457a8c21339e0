"""On shutdown, an in-flight stream gets exactly `gate.shutdown_grace`, not twice that."""

from __future__ import annotations

import asyncio
import contextlib

import aiohttp

from tests.gate.harness import running_stack


async def test_a_stream_that_never_ends_is_cut_when_the_grace_period_is_over(
    tmp_path, sim_host, fakenvml_path
):
    loop = asyncio.get_running_loop()
    stack_cm = running_stack(tmp_path, sim_host, fakenvml_path, grace="1s")
    stack = await stack_cm.__aenter__()
    stopped = False
    try:
        async with aiohttp.ClientSession() as session:
            # A million tokens at 400 tokens/s: the stream outlives any grace period.
            body = {"model": "llama3.2:3b", "prompt": "x", "options": {"sim_tokens": 1000000}}
            async with session.post(stack.gate_url + "/api/generate", json=body) as resp:
                assert b'"response"' in await resp.content.readline()
                assert len(stack.gate.core.leases()) == 1

                async def read_to_the_end() -> float:
                    with contextlib.suppress(aiohttp.ClientPayloadError):
                        await resp.read()
                    return loop.time()

                reading = asyncio.create_task(read_to_the_end())
                signalled = loop.time()
                shutting_down = asyncio.create_task(stack_cm.__aexit__(None, None, None))
                stopped = True
                cut = await asyncio.wait_for(reading, 10) - signalled
                await shutting_down
        assert 0.9 < cut < 1.8, cut
        assert stack.gate.core.leases() == []
    finally:
        if not stopped:
            await stack_cm.__aexit__(None, None, None)
