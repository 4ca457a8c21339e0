"""Go's net/http, read by gpugate/proxy/dialects/go.py, against the real thing.

Every case of corpus_go.py goes, alone and followed by a probe request, to the Go net/http
echo server built with the oracle's toolchain (build/nethttp/nethttp-echo, Ollama's server
settings) and to the same echo handler behind the Go dialect (wire.serve_echo); the raw
answers must be the same bytes (Date values blanked) and end the same way. `compare` takes
two addresses, so the same corpus can be pointed at the gate in front of the oracle.
"""

from __future__ import annotations

import inspect

import pytest

from gpugate.proxy.dialects.base import HttpDialect
from gpugate.proxy.dialects.go import DIALECT
from tests.dialects.corpus_go import Case, cases
from tests.dialects.wire import PROBE, Outcome, exchange

CORPUS = cases()


def compare(
    oracle: tuple[str, int], subject: tuple[str, int], data: bytes
) -> tuple[Outcome, Outcome]:
    """The oracle's and the subject's answers to the same bytes."""
    return exchange(oracle, data), exchange(subject, data)


def test_dialect_satisfies_the_interface() -> None:
    """Every method of `HttpDialect` is there and takes at least its parameters."""
    assert DIALECT.name == "go"
    for name in ("read_head", "chunks", "answer_head", "on_eof_mid_head"):
        wanted = inspect.signature(getattr(HttpDialect, name)).parameters
        given = inspect.signature(getattr(type(DIALECT), name)).parameters
        for parameter in wanted.values():
            assert parameter.name in given, (name, parameter.name)
            assert given[parameter.name].kind == parameter.kind, (name, parameter.name)
    reader = DIALECT.chunks()
    assert list(inspect.signature(reader.feed).parameters) == ["data", "date"]


def test_corpus_is_large() -> None:
    assert len(CORPUS) >= 300


@pytest.mark.parametrize("probe", [False, True], ids=["alone", "probe"])
@pytest.mark.parametrize("case", CORPUS, ids=[c.name for c in CORPUS])
def test_same_answer_as_go(
    case: Case, probe: bool, oracle: tuple[str, int], subject: tuple[str, int]
) -> None:
    data = case.data + PROBE if probe else case.data
    expected, got = compare(oracle, subject, data)
    assert expected.ended != "open"
    assert got.data == expected.data
    assert got.ended == expected.ended


TRICKLED = [c for c in CORPUS if len(c.data) < 3_000]


@pytest.mark.parametrize("case", TRICKLED, ids=[c.name for c in TRICKLED])
def test_same_answer_as_go_in_pieces(
    case: Case, oracle: tuple[str, int], subject: tuple[str, int]
) -> None:
    """Sent 7 bytes at a time, with a probe after: the same answers as sent whole."""
    data = case.data + PROBE
    expected = exchange(oracle, data, piece=7)
    got = exchange(subject, data, piece=7)
    assert expected.ended != "open"
    assert got == expected
