"""The floor of any aiohttp proxy: forward everything, stream the answer, nothing else.

A websocket upgrade is relayed as a websocket pair, frames both ways, nothing else.

python -m bench.passthrough --port P --upstream http://127.0.0.1:U [--uvloop] [--llhttp]

With --llhttp the requests go upstream through the gate's forwarding client
(`gpugate/proxy/http1.py`, keep-alive connections parsed by llhttp) instead of aiohttp's
client, and nothing else changes: the row that measures what that client buys.
"""

from __future__ import annotations

import argparse
import asyncio

import aiohttp
from aiohttp import web

HOP = {"connection", "keep-alive", "transfer-encoding", "te", "trailer", "upgrade", "host"}


def llhttp_forward(upstream: str):  # type: ignore[no-untyped-def]
    """The same forward, its upstream side on the gate's forwarding client."""
    from yarl import URL

    from gpugate.config.model import UpstreamTimeouts
    from gpugate.proxy.pool import UpstreamPool

    url = URL(upstream)
    assert url.host is not None and url.port is not None
    pool = UpstreamPool(url.host, url.port)
    bounds = UpstreamTimeouts()
    host = f"{url.host}:{url.port}".encode()
    drop = {h.encode() for h in HOP} | {b"content-length"}

    async def forward(request: web.Request) -> web.StreamResponse:
        body = await request.read()
        head = [f"{request.method} {request.raw_path} HTTP/1.1\r\nHost: ".encode(), host]
        for name, value in request.raw_headers:
            if name.lower() not in drop:
                head += (b"\r\n", name, b": ", value)
        head.append(b"\r\nContent-Length: %d\r\n\r\n" % len(body))
        up = await pool.send(b"".join(head), body, bounds)
        try:
            response = web.StreamResponse(status=up.status)
            for name, value in up.raw_headers:
                if name.lower() not in drop:
                    response.headers[name.decode()] = value.decode()
            await response.prepare(request)
            while chunk := await up.chunk(bounds.idle):
                await response.write(chunk)
            await response.write_eof()
        except BaseException:
            up.close()
            raise
        up.release()
        return response

    return forward


def make_app(upstream: str, llhttp: bool = False) -> web.Application:
    session: aiohttp.ClientSession | None = None

    async def start(app: web.Application) -> None:
        nonlocal session
        session = aiohttp.ClientSession(
            timeout=aiohttp.ClientTimeout(total=None),
            auto_decompress=False,
            connector=aiohttp.TCPConnector(limit=0),
        )

    async def stop(app: web.Application) -> None:
        assert session is not None
        await session.close()

    async def relay(request: web.Request) -> web.StreamResponse:
        assert session is not None
        async with session.ws_connect(
            upstream + str(request.rel_url), max_msg_size=0, autoping=False
        ) as up:
            down = web.WebSocketResponse(max_msg_size=0, autoping=False, compress=False)
            await down.prepare(request)

            async def pump(src, dst) -> None:
                async for msg in src:
                    if msg.type is aiohttp.WSMsgType.BINARY:
                        await dst.send_bytes(msg.data)
                    elif msg.type is aiohttp.WSMsgType.TEXT:
                        await dst.send_str(msg.data)
                await dst.close()

            await asyncio.gather(pump(up, down), pump(down, up))
            return down

    async def forward(request: web.Request) -> web.StreamResponse:
        assert session is not None
        if request.headers.get("Upgrade", "").lower() == "websocket":
            return await relay(request)
        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP}
        body = await request.read()
        async with session.request(
            request.method, upstream + str(request.rel_url), headers=headers, data=body
        ) as up:
            response = web.StreamResponse(status=up.status)
            for k, v in up.headers.items():
                if k.lower() not in HOP:
                    response.headers[k] = v
            await response.prepare(request)
            async for chunk in up.content.iter_any():
                await response.write(chunk)
            await response.write_eof()
            return response

    app = web.Application()
    app.on_startup.append(start)
    app.on_cleanup.append(stop)
    app.router.add_route("*", "/{tail:.*}", llhttp_forward(upstream) if llhttp else forward)
    return app


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--upstream", required=True)
    parser.add_argument("--uvloop", action="store_true")
    parser.add_argument("--llhttp", action="store_true", help="the gate's forwarding client")
    args = parser.parse_args()
    if args.uvloop:
        import uvloop

        uvloop.install()
    web.run_app(
        make_app(args.upstream, args.llhttp),
        host="127.0.0.1",
        port=args.port,
        access_log=None,
        print=None,
    )


if __name__ == "__main__":
    main()
