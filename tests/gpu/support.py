"""Consumers for attribution tests: only their names and process rules matter."""

from __future__ import annotations

from gpugate.config.model import Address, Consumer, ProcessMatch, Upstream


def consumer(name: str, match: ProcessMatch, port: int = 11434) -> Consumer:
    return Consumer(
        name=name,
        runtime="http",
        listen=Address("0.0.0.0", port),
        upstream=Upstream("http", "127.0.0.1", port + 1),
        processes=match,
    )
