"""Each dialect declares the traits the relay reads from it, as its server behaves."""

from __future__ import annotations

import pytest

from gpugate.proxy.dialects import DIALECTS, dialect_of
from gpugate.proxy.dialects.base import AnswerVersion
from gpugate.runtimes.dialect import ServerDialect

TRAITS = {
    ServerDialect.GO: (AnswerVersion.HTTP10_AS_ASKED, False, False, False),
    ServerDialect.AIOHTTP: (AnswerVersion.AS_ASKED, False, False, False),
    ServerDialect.HTTPLIB: (AnswerVersion.HTTP11, False, False, True),
    ServerDialect.HTTPLIB_0_20: (AnswerVersion.HTTP11, False, False, True),
    ServerDialect.UVICORN: (AnswerVersion.HTTP11, True, True, False),
}


def test_every_server_has_its_traits_written_here():
    assert set(TRAITS) == set(ServerDialect) == set(DIALECTS)


@pytest.mark.parametrize("server", list(ServerDialect), ids=lambda s: s.name)
def test_the_dialect_declares_its_servers_traits(server):
    dialect = dialect_of(server)
    declared = (
        dialect.answers,
        dialect.chunks_any_version,
        dialect.keeps_as_head_said,
        dialect.answers_after_client_end,
    )
    assert declared == TRAITS[server]


@pytest.mark.parametrize("server", list(ServerDialect), ids=lambda s: s.name)
def test_every_dialect_writes_its_own_answer_head_for_any_request(server):
    head = dialect_of(server).answer_head(
        503, [("Content-Type", "text/plain")], b"Mon, 07 Dec 2026 11:00:00 GMT",
        length=3, close=True, version=(1, 0), method="HEAD",
    )  # fmt: skip
    assert head.startswith(b"HTTP/1.") and head.endswith(b"\r\n\r\n")
