"""Corpus B against the real llama-server (cpp-httplib 0.58.0): 0 differences in what the
server decides itself; the same corpus through the gate in front of it, counted per class
(httplib_gate.py); its chunk-size lines as the server reads them. One server for the
module, started as tests/llamaserver starts it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from gpugate.proxy.dialects.httplib import DIALECT
from tests.dialects.harness import Case, exchange
from tests.dialects.httplib_check import differences
from tests.dialects.httplib_gate import show, through_gate
from tests.dialects.through_gate import Difference
from tests.llamaserver.conftest import BINARY, LlamaServer, locate_binary, server_starter
from tests.llamaserver.gguf_models import write_tiny_llama

PATHS = ["/health", "/nope"]
GET_ONLY = ["/props", "/v1/models", "/slots"]

THROUGH_THE_GATE = {Difference.SAME: 108}
"""Measured: cases per class through a llama-server consumer in front of this server
(docs/reliability.md, "Through the gate: cpp-httplib's corpora")."""


@pytest.fixture(scope="module")
def llama(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LlamaServer]:
    directory: Path = tmp_path_factory.mktemp("llama-dialect")
    model = write_tiny_llama(directory / "plain.gguf", seed=11)
    with server_starter("real", [str(locate_binary(BINARY))], directory) as start:
        yield start(["-m", str(model)])


async def test_corpus_has_no_differences(llama: LlamaServer) -> None:
    found, reals = await differences(DIALECT, llama.port, PATHS, GET_ONLY, whisper=False)
    assert found == []
    assert len(reals) >= 90
    outcomes = [real for _, real in reals]
    assert sum(o.data.startswith(b"HTTP/1.1 400 Bad Request\r\n") for o in outcomes) >= 15
    assert sum(o.data.startswith(b"HTTP/1.1 404 Not Found\r\n") for o in outcomes) >= 15
    assert any(o.closed and o.data == b"" for o in outcomes)  # the line limit: no answer
    assert sum(o.closed for o in outcomes) >= 10 and sum(not o.closed for o in outcomes) >= 30
    assert not any(o.stalled for o in outcomes)


async def test_corpus_through_the_gate(
    llama: LlamaServer, tmp_path: Path, sim_host, fakenvml_path: Path
) -> None:
    """Every case to the server directly and through the gate: the classes as measured,
    and the cases alike are alike byte for byte."""
    found, reordered = await through_gate(
        "llama-server", llama.port, tmp_path, fakenvml_path, PATHS, GET_ONLY, whisper=False
    )
    show(found)
    assert {kind: len(names) for kind, names in found.items()} == THROUGH_THE_GATE
    assert reordered == []


SIZE_LINES = [b"f", b"F", b"0f", b"00F", b"0xf", b" f", b"f ", b"f\t", b"f;x=y", b"f; a b",
              b"f;\x01", b"-f", b"+f", b"f x", b"fg", b"", b"1" + b"0" * 16]  # fmt: skip


async def test_chunk_sizes_as_llama_server_reads_them(llama: LlamaServer) -> None:
    """Each size line before a 15-byte JSON body on a route that reads it (`/tokenize`):
    refused by llama-server (400) exactly where the dialect's chunked reader refuses it."""
    payload = b'{"content":"a"}'
    for size in SIZE_LINES:
        body = size + b"\r\n" + payload + b"\r\n0\r\n\r\n"
        data = (
            b"POST /tokenize HTTP/1.1\r\nHost: h\r\nContent-Type: application/json\r\n"
            b"Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n" + body
        )
        outcome = await exchange("127.0.0.1", llama.port, Case(size.decode("latin-1"), data))
        status = int(outcome.data.split(b" ", 2)[1])
        refused = DIALECT.chunks().feed(body, b"").refusal is not None
        assert status == (400 if refused else 200), (size, outcome.data[:80])
