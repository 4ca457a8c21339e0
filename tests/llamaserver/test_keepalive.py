"""llama-server's connections, real and simulated: every streamed answer ends its
connection though it said `Keep-Alive` (its stream provider returns false once done,
which cpp-httplib takes as a cancelled write), so the gate's pool never sends a request
on a connection that carried one, and opens a spare for the next; its answers of known
length keep theirs."""

from __future__ import annotations

import socket

from gpugate.config.model import UpstreamTimeouts
from gpugate.proxy.pool import UpstreamPool
from gpugate.runtimes.llamaserver.single import LlamaSingleReading

BOUNDS = UpstreamTimeouts(connect=30.0, first_byte=60.0, idle=60.0)
BODY = b'{"prompt": "hi", "n_predict": 2, "stream": true}'
STREAM = (
    b"POST /completion HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
    b"Content-Length: %d\r\n\r\n%b" % (len(BODY), BODY)
)
HEALTH = b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n"


def test_a_streamed_answer_ends_its_connection(plain_server):
    with socket.create_connection(("127.0.0.1", plain_server.port), timeout=60) as sock:
        sock.sendall(STREAM)
        received = b""
        while chunk := sock.recv(65536):
            received += chunk
    head = received.split(b"\r\n\r\n", 1)[0]
    assert b"Transfer-Encoding: chunked" in head and b"Keep-Alive: timeout=5, max=100" in head
    assert b"Connection: close" not in head
    assert received.endswith(b"0\r\n\r\n")  # whole, then closed by the server


async def test_the_pool_never_reuses_a_connection_that_carried_a_stream(plain_server):
    pool = UpstreamPool("127.0.0.1", plain_server.port, keep_alive=LlamaSingleReading.keep_alive)
    try:
        for _ in range(3):
            response = await pool.send(STREAM, None, BOUNDS)
            body = await response.read(1 << 20, 60.0)
            response.release()
            assert response.status == 200 and body.rstrip().endswith(b"}")
            # Its connection is closed, and a spare opened for the next request.
            spare = pool._spare
            assert spare is not None
            await spare
            assert pool.idle == 1
        # The first stream's connection, then a spare each, each carrying one stream.
        assert pool.opened == 4
        for _ in range(3):
            response = await pool.send(HEALTH, None, BOUNDS)
            assert await response.read(1000, 60.0) == b'{"status":"ok"}'
            response.release()
        assert (pool.opened, pool.idle) == (4, 1)
    finally:
        pool.close()
