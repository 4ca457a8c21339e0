"""`gpugate serve`: one process, one listener per consumer, one control listener.

On SIGINT/SIGTERM the listeners stop accepting, in-flight streams may finish for up to
`gate.shutdown_grace`, then whatever is left is cancelled; every lease is released by
its request's own `finally`, and the gate's background work stops last.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
from collections.abc import Callable
from pathlib import Path

from aiohttp import web

from gpugate.config.model import Config, RuntimeKind
from gpugate.control.app import control_app
from gpugate.control.metrics import GateMetrics
from gpugate.gate.gate import Gate
from gpugate.gpu.sampler import Sampler
from gpugate.identity import IdentityResolver
from gpugate.proxy.listener import ConsumerListener
from gpugate.store.db import Store

log = logging.getLogger("gpugate.serve")


def _url(host: str, port: int) -> str:
    shown = f"[{host}]" if ":" in host else host
    return f"http://{shown}:{port}"


class ListenError(RuntimeError):
    """A listener could not be opened (port taken, address not on this host)."""


async def _start_site(
    app: web.Application, host: str, port: int, grace: float, what: str
) -> tuple[web.AppRunner, tuple[str, int]]:
    runner = web.AppRunner(app, handler_cancellation=True, shutdown_timeout=grace, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host or None, port, reuse_address=True)
    try:
        await site.start()
    except OSError as exc:
        await runner.cleanup()
        reason = os.strerror(exc.errno) if exc.errno else str(exc)
        raise ListenError(f"cannot listen for {what} on {_url(host, port)}: {reason}") from exc
    bound = runner.addresses[0]
    return runner, (bound[0], bound[1])


async def serve(
    config: Config,
    stop: asyncio.Event,
    *,
    on_ready: Callable[[list[str]], None] | None = None,
    gate_factory: Callable[[Config], Gate] | None = None,
) -> None:
    """Run the gate until `stop` is set."""
    if gate_factory is not None:
        gate = gate_factory(config)
    else:
        gate = Gate(config, Sampler.from_config(config), store=Store(config.gate.database))
    metrics = GateMetrics(gate)
    await gate.start()
    grace = config.gate.shutdown_grace
    runners: list[web.AppRunner] = []
    lines = []
    try:
        resolver = IdentityResolver(config.identities)
        for link in gate.links.values():
            consumer = link.consumer
            app = ConsumerListener(gate, link, resolver).app()
            runner, bound = await _start_site(
                app, consumer.listen.host, consumer.listen.port, grace, consumer.name
            )
            runners.append(runner)
            lines.append(
                f"gpugate: {consumer.name} listening on {_url(*bound)} -> {consumer.upstream.url}"
            )
        for consumer in config.consumers:
            if consumer.runtime is not RuntimeKind.OLLAMA:
                lines.append(
                    f"gpugate: {consumer.name} ({consumer.runtime.value}) is not fronted by this "
                    "version; its memory is observed and counted"
                )
        control = config.gate.control
        runner, bound = await _start_site(
            control_app(gate, metrics), control.host, control.port, 1.0, "the control API"
        )
        runners.append(runner)
        lines.append(f"gpugate: control on {_url(*bound)} (/metrics, /gate/v1/status)")
        lines.append("gpugate: ready")
        if on_ready is not None:
            on_ready(lines)
        await stop.wait()
    finally:
        await asyncio.gather(*(r.cleanup() for r in runners), return_exceptions=True)
        await gate.close()


def configure_logging() -> None:
    """Events as one JSON line each on stderr; other messages as plain lines."""
    handler = logging.StreamHandler(sys.stderr)

    class _Format(logging.Formatter):
        def format(self, record: logging.LogRecord) -> str:
            if record.name == "gpugate.events":
                return record.getMessage()
            return f"{record.levelname.lower()} {record.name}: {record.getMessage()}"

    handler.setFormatter(_Format())
    root = logging.getLogger("gpugate")
    root.handlers[:] = [handler]
    root.setLevel(os.environ.get("GPUGATE_LOG_LEVEL", "INFO").upper())
    root.propagate = False


def run_serve(config_path: Path) -> int:
    """The `gpugate serve` command."""
    from gpugate.config.loader import ConfigError, load_config_with_warnings

    configure_logging()
    try:
        loaded = load_config_with_warnings(config_path)
    except ConfigError as exc:
        print(exc, file=sys.stderr)
        return 2
    for warning in loaded.warnings:
        print(warning, file=sys.stderr)

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(signum, stop.set)

        def ready(lines: list[str]) -> None:
            for line in lines:
                print(line, flush=True)

        await serve(loaded.config, stop, on_ready=ready)

    # asyncio's own loop by default: uvloop measured a few per cent more requests per
    # second but a several times worse p99 at 64 connections (docs/benchmarks.md).
    try:
        if os.environ.get("GPUGATE_LOOP", "asyncio") == "uvloop":
            import uvloop

            uvloop.run(main())
        else:
            asyncio.run(main())
    except ListenError as exc:
        print(f"gpugate serve: {exc}", file=sys.stderr)
        return 1
    return 0
