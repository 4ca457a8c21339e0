"""Corpus B against the real whisper-server (cpp-httplib 0.20.0): 0 differences in what the
server decides itself; the same corpus through the gate in front of it, counted per class
(httplib_gate.py). One server for the module, started as tests/whisper starts it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from gpugate.proxy.dialects.httplib import WHISPER
from tests.dialects.httplib_check import differences
from tests.dialects.httplib_gate import show, through_gate
from tests.dialects.through_gate import Difference
from tests.whisper.conftest import WhisperServer, locate_binary, server_starter
from tests.whisper.ggml_models import write_english

PATHS = ["/health", "/nope"]
GET_ONLY = ["/"]

THROUGH_THE_GATE = {Difference.SAME: 94}
"""Measured: cases per class through a whisper consumer in front of this server
(docs/reliability.md, "Through the gate: cpp-httplib's corpora")."""


@pytest.fixture(scope="module")
def whisper(tmp_path_factory: pytest.TempPathFactory) -> Iterator[WhisperServer]:
    directory: Path = tmp_path_factory.mktemp("whisper-dialect")
    model = write_english(directory / "ggml-tiny.en.bin", seed=1)
    with server_starter("real", [str(locate_binary())], directory) as start:
        yield start(["-m", str(model)])


async def test_corpus_has_no_differences(whisper: WhisperServer) -> None:
    found, reals = await differences(WHISPER, whisper.port, PATHS, GET_ONLY, whisper=True)
    assert found == []
    assert len(reals) >= 80
    outcomes = [real for _, real in reals]
    assert sum(o.data.startswith(b"HTTP/1.1 400 Bad Request\r\n") for o in outcomes) >= 15
    assert sum(b"\r\n\r\nFile Not Found (" in o.data for o in outcomes) >= 15
    # Answers after the client's half-close are never written.
    assert any(o.closed and o.data == b"" for o in outcomes)
    assert sum(o.closed for o in outcomes) >= 5 and sum(not o.closed for o in outcomes) >= 30
    assert not any(o.stalled for o in outcomes)


async def test_corpus_through_the_gate(
    whisper: WhisperServer, tmp_path: Path, sim_host, fakenvml_path: Path
) -> None:
    """Every case to the server directly and through the gate: the classes as measured,
    and the cases alike are alike byte for byte."""
    found, reordered = await through_gate(
        "whisper", whisper.port, tmp_path, fakenvml_path, PATHS, GET_ONLY, whisper=True
    )
    show(found)
    assert {kind: len(names) for kind, names in found.items()} == THROUGH_THE_GATE
    assert reordered == []
