"""Running corpus B against one real cpp-httplib server and the dialect's server."""

from __future__ import annotations

from gpugate.proxy.dialects.httplib import HttplibDialect
from tests.dialects import dialect_server
from tests.dialects.corpus_httplib import corpus, record, replay
from tests.dialects.harness import Case, Outcome, exchange

SECONDS = 30.0


async def differences(
    dialect: HttplibDialect,
    port: int,
    paths: list[str],
    get_only: list[str],
    *,
    whisper: bool,
) -> tuple[list[tuple[str, Outcome, Outcome]], list[tuple[Case, Outcome]]]:
    """Every case sent to the real server (one at a time: it serves few connections at once)
    and to the dialect's; the cases whose outcomes differ, and the real outcomes."""
    defaults = frozenset(name.lower() for name, _ in dialect.default_headers)
    records = await record(port, paths + get_only, defaults)
    cases = corpus(paths, get_only, whisper=whisper)
    found = []
    reals = []
    async with dialect_server.running(dialect, replay(records, "/nope")) as ours:
        for case in cases:
            real = await exchange("127.0.0.1", port, case, seconds=SECONDS)
            mine = await exchange("127.0.0.1", ours, case, seconds=SECONDS)
            reals.append((case, real))
            if real != mine:
                found.append((case.name, real, mine))
    return found, reals
