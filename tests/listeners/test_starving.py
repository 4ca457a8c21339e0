"""No client starves the others: a client that takes nothing of its answer loses its
connection and its lease; one client address cannot hold the whole listener; and a full
listener makes room by closing its longest-idle keep-alive connection before it refuses."""

from __future__ import annotations

import asyncio
import contextlib
import json
import resource

from gpugate.core.effects import EventKind
from tests.gate.harness import running_stack
from tests.listeners.wire import closed_by_peer, connect, read_reply, request

FLOOD_LINE = b'{"model":"llama3.2:3b","response":"' + b"x" * 4000 + b'","done":false}\n'


async def flood_upstream() -> tuple[asyncio.Server, str]:
    """An Ollama that answers every generate with an endless NDJSON stream, as fast as it can
    be taken, says its model generates, and lists nothing."""

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError, asyncio.IncompleteReadError):
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":")[1])
                await reader.readexactly(length)
                if head.startswith(b"POST /api/generate"):
                    writer.write(
                        b"HTTP/1.1 200 OK\r\nContent-Type: application/x-ndjson\r\n"
                        b"Transfer-Encoding: chunked\r\n\r\n"
                    )
                    while True:
                        writer.write(b"%x\r\n%b\r\n" % (len(FLOOD_LINE), FLOOD_LINE))
                        await writer.drain()
                # /api/show: a model that generates; anything else: a listing of nothing.
                show = head.startswith(b"POST /api/show")
                body = b'{"capabilities":["completion"]}' if show else b'{"models":[]}'
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%b" % (len(body), body))
                await writer.drain()
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    return server, f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"


async def test_a_client_that_takes_nothing_loses_its_connection_and_its_lease(
    tmp_path, sim_host, fakenvml_path
):
    server, upstream = await flood_upstream()
    limits = "limits: {send_timeout: 300ms}\n"
    async with running_stack(
        tmp_path, sim_host, fakenvml_path, upstream=upstream, consumer_yaml=limits
    ) as stack:
        granted = stack.next_event(EventKind.LEASE_GRANTED)
        released = stack.next_event(EventKind.LEASE_RELEASED)
        reader, writer = await connect(stack.gate_url)
        body = json.dumps({"model": "llama3.2:3b", "prompt": "hi"}).encode()
        writer.write(request("POST", "/api/generate", body))  # and never read
        await asyncio.wait_for(granted, 10)
        await asyncio.wait_for(released, 20)
        assert stack.gate.core.leases() == []
        # The connection is gone: what the client reads now ends.
        with contextlib.suppress(ConnectionError):
            async with asyncio.timeout(20):
                while await reader.read(1 << 20):
                    pass
        writer.close()
    server.close()


async def busy(
    url: str, *, local: str = "127.0.0.1"
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A connection with a request in flight: its body never comes."""
    host, port = url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port), local_addr=(local, 0))
    writer.write(request("POST", "/api/show", b"{}")[:-2])
    await writer.drain()
    return reader, writer


async def answered(url: str, *, local: str = "127.0.0.1") -> int | None:
    host, port = url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port), local_addr=(local, 0))
    try:
        writer.write(request("GET", "/api/version"))
        return (await read_reply(reader)).status
    finally:
        writer.close()


PER_CLIENT = "limits: {max_connections: 6, max_connections_per_client: 3, idle_timeout: 30s}\n"


async def test_one_address_cannot_take_the_listener_from_the_others(
    tmp_path, sim_host, fakenvml_path
):
    async with running_stack(tmp_path, sim_host, fakenvml_path, consumer_yaml=PER_CLIENT) as stack:
        hogs = [await busy(stack.gate_url) for _ in range(3)]
        assert await answered(stack.gate_url) == 503  # this address is at its cap
        assert await answered(stack.gate_url, local="127.0.0.2") == 200
        for _, writer in hogs:
            writer.close()


FULL = "limits: {max_connections: 4, max_connections_per_client: 4, idle_timeout: 30s}\n"


async def test_a_full_listener_closes_its_longest_idle_connection_for_a_new_one(
    tmp_path, sim_host, fakenvml_path
):
    async with running_stack(tmp_path, sim_host, fakenvml_path, consumer_yaml=FULL) as stack:
        idle = []
        for _ in range(4):
            reader, writer = await connect(stack.gate_url)
            writer.write(request("GET", "/api/version"))
            assert (await read_reply(reader)).status == 200
            idle.append((reader, writer))
        # Full of idle keep-alive connections: the oldest goes, the newcomer is served.
        assert await answered(stack.gate_url) == 200
        assert await closed_by_peer(idle[0][0]) == b""
        # The others were left alone.
        for reader, writer in idle[1:]:
            writer.write(request("GET", "/api/version"))
            assert (await read_reply(reader)).status == 200
        for _, writer in idle:
            writer.close()


async def test_a_full_listener_of_busy_connections_refuses(tmp_path, sim_host, fakenvml_path):
    async with running_stack(tmp_path, sim_host, fakenvml_path, consumer_yaml=FULL) as stack:
        hogs = [await busy(stack.gate_url) for _ in range(4)]
        assert await answered(stack.gate_url, local="127.0.0.2") == 503
        for _, writer in hogs:
            writer.close()


async def test_1500_idle_connections_do_not_stop_a_normal_client(tmp_path, sim_host, fakenvml_path):
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, 8192)), hard))
    try:
        async with running_stack(tmp_path, sim_host, fakenvml_path) as stack:
            opened = []
            for _ in range(1500):
                reader, writer = await connect(stack.gate_url)
                writer.write(request("GET", "/api/version"))
                assert (await read_reply(reader)).status == 200
                opened.append(writer)  # and kept open, idle
            assert await answered(stack.gate_url, local="127.0.0.3") == 200
            for writer in opened:
                writer.close()
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
