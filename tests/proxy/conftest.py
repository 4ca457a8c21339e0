from __future__ import annotations

import aiohttp
import attrs
import pytest

from tests.gate.harness import running_stack

CORS_HEADERS = (
    "Access-Control-Allow-Origin",
    "Access-Control-Allow-Methods",
    "Access-Control-Allow-Headers",
    "Access-Control-Max-Age",
    "Vary",
    "Allow",
)


@attrs.frozen
class Answer:
    """What a client can see of one answer, minus the parts that differ by nature (Date)."""

    status: int
    body: bytes
    content_type: str | None
    content_length: str | None
    cors: tuple[tuple[str, tuple[str, ...]], ...]
    server: str | None


async def ask(
    session: aiohttp.ClientSession,
    url: str,
    method: str,
    path: str,
    headers: dict[str, str],
    body: bytes | None = None,
) -> Answer:
    """One request; the answer as the client sees it."""
    async with session.request(method, url + path, headers=headers, data=body) as resp:
        data = await resp.read()
        cors = tuple((name, tuple(resp.headers.getall(name, ()))) for name in CORS_HEADERS)
        return Answer(
            resp.status,
            data,
            resp.headers.get("Content-Type"),
            resp.headers.get("Content-Length"),
            cors,
            resp.headers.get("Server"),
        )


@pytest.fixture
async def stack(tmp_path, sim_host, fakenvml_path):
    async with running_stack(tmp_path, sim_host, fakenvml_path) as stack:
        yield stack
