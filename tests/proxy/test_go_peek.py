"""Go's server waits for 4 bytes after an answer before it reads the next request
(server.go `conn.serve`: `c.bufr.Peek(4)`), and closes without a word if the client's end
comes first: a stray CRLF after a served GET is neither read nor refused."""

from __future__ import annotations

from gpugate.proxy.dialects import go
from tests.listeners.wire import closed_by_peer, read_reply
from tests.proxy.test_server import get, serving


async def test_a_stray_crlf_after_an_answer_then_the_clients_end_closes_silently():
    async with serving() as served:
        reader, writer = await served.connect()
        writer.write(get("/a") + b"\r\n")
        answer = await read_reply(reader)
        writer.write_eof()
        rest = await closed_by_peer(reader)
        writer.close()
    assert (answer.status, rest) == (200, b"")


async def test_the_bytes_after_the_wait_are_read_as_go_reads_them():
    async with serving() as served:
        reader, writer = await served.connect()
        writer.write(get("/a") + b"\r\n")
        answer = await read_reply(reader)
        writer.write(b"\r\n")  # 4 bytes now: an empty request line
        rest = await closed_by_peer(reader)
        writer.close()
    assert (answer.status, rest) == (200, go.BAD_REQUEST.data)
