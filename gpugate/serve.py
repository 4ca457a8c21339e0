"""`gpugate serve`: one process, one listener per fronted consumer, one control listener.

A consumer is fronted when the runtime registry `serve` is given (the shipped one unless a
test brings its own) knows its runtime (the gate made a link for it); the
others are observed through NVML and counted. The file is read with the same registry's
runtime table.

On SIGINT/SIGTERM the listeners stop accepting, in-flight streams may finish for up to
`gate.shutdown_grace`, then whatever is left is cancelled; every lease is released by
its request's own `finally`, and the gate's background work stops last.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import signal
import sys
from collections.abc import Callable, Coroutine
from pathlib import Path

from gpugate.config.model import Address, Config, ListenerLimits
from gpugate.control.agent import AgentResponder
from gpugate.control.app import control_app
from gpugate.control.metrics import GateMetrics
from gpugate.gate.gate import Gate, Link
from gpugate.gpu.nvml import library_from, simulated_host
from gpugate.gpu.sampler import Sampler
from gpugate.identity import IdentityResolver
from gpugate.notify import Notifier, stop_task
from gpugate.proxy.listener import ConsumerListener
from gpugate.proxy.runners import (
    GuardedRunner,
    ListenerRunner,
    fit_caps,
    quiet_loop_errors,
    raise_fd_limit,
)
from gpugate.reload import apply_reload, reload_file, unset_secrets
from gpugate.runtimes.registry import RUNTIMES, RuntimeRegistry
from gpugate.store.db import CLOSE_TIMEOUT, Store

log = logging.getLogger("gpugate.serve")

EXIT_CONFIG = 78
"""EX_CONFIG: the file does not load or names a secret that is not set, as every command
exits for a configuration it cannot use (gpugate.commands.exits.Exit.CONFIG)."""
GC_THRESHOLDS = (5000, 20, 10)
"""The collector's thresholds once serving (Python's: 700, 10, 10). A request's objects die
young and by their reference counts; collected every 700 allocations, those of requests
in flight (1,000 held streams' protocols, tasks and buffers) are promoted and soon make
the oldest generation due: full passes of 30-45 ms every few seconds, the chunk and
first-byte p99 of a gate holding many streams (docs/benchmarks.md)."""
CONTROL_LIMITS = ListenerLimits()
CONTROL_GRACE = 1.0
STORE_LAST_WRITE = 0.5
"""Seconds the store's last write may take at shutdown when the drain used all the grace."""


def _url(host: str, port: int) -> str:
    shown = f"[{host}]" if ":" in host else host
    return f"http://{shown}:{port}"


Runner = GuardedRunner | ListenerRunner


class ListenError(RuntimeError):
    """A listener could not be opened (port taken, address not on this host)."""


async def _start_site(
    runner: Runner, address: Address, what: str
) -> tuple[Runner, tuple[str, int]]:
    try:
        await runner.start(address.host or None, address.port)
    except OSError as exc:
        reason = os.strerror(exc.errno) if exc.errno else str(exc)
        raise ListenError(
            f"cannot listen for {what} on {_url(address.host, address.port)}: {reason}"
        ) from exc
    bound = runner.addresses[0]
    return runner, (bound[0], bound[1])


def _connection_caps(config: Config, links: list[Link]) -> list[int]:
    """Each listener's client and upstream caps (two a listener), the control listener's
    last, within the open-files limit."""
    before, after = raise_fd_limit()
    if after > before:
        log.info("open files limit %d (raised from %d)", after, before)
    else:
        log.info("open files limit %d", after)
    # A listener holds its clients' sockets, and one to the runtime per request in flight.
    wanted = []
    for link in links:
        limits = link.consumer.limits
        wanted += [(limits.max_connections, 1), (limits.upstream_connections, 1)]
    wanted.append((CONTROL_LIMITS.max_connections, 1))
    caps = fit_caps(wanted, after)
    for i, link in enumerate(links):
        limits = link.consumer.limits
        for key, asked, cap in (
            ("max_connections", limits.max_connections, caps[2 * i]),
            ("upstream_connections", limits.upstream_connections, caps[2 * i + 1]),
        ):
            if cap < asked:
                log.warning(
                    "%s: %s %d lowered to %d to stay within the open files limit (%d); "
                    "raise LimitNOFILE to keep it",
                    link.consumer.name,
                    key,
                    asked,
                    cap,
                    after,
                )
    return caps


def store_path(config: Config, simulated: Path | None) -> Path | None:
    """Where the store lives: the configured file, except in front of a simulated host
    (`simulated`: its state file), whose measured sizes and history must never reach the
    real host's state: there it is `gpugate.db` beside the simulated host's state."""
    configured = config.gate.database
    if simulated is None or configured is None:
        return configured
    if simulated == Path():
        log.warning(
            "NVML is a simulated host's: nothing is stored (not %s, the real host's state)",
            configured,
        )
        return None
    database = simulated.resolve().parent / "gpugate.db"
    if configured.resolve() != database:
        log.warning(
            "NVML is a simulated host's: the store is %s beside its state, not %s "
            "(the real host's state is never written by a simulated one)",
            database,
            configured,
        )
    return database


async def serve(
    config: Config,
    stop: asyncio.Event,
    *,
    on_ready: Callable[[list[str]], None] | None = None,
    gate_factory: Callable[[Config], Gate] | None = None,
    reloads: asyncio.Queue[Config] | None = None,
    on_reloaded: Callable[[], None] | None = None,
    on_listening: Callable[[], None] | None = None,
    runtimes: RuntimeRegistry = RUNTIMES,
) -> None:
    """Run the gate until `stop` is set, applying each configuration put on `reloads`.

    `on_listening` is called once every listener is up (requests are served from then on:
    one that arrives while an `always_warm` runtime starts waits for it); `on_ready`, with
    the lines to print, once every `always_warm` runtime the gate starts is up too, or its
    start timeout ran out: the last line is `gpugate: ready`, or says which is not up.
    `runtimes` builds each consumer's runtime (unless `gate_factory` builds the gate)."""
    loop = asyncio.get_running_loop()
    previous_handler = loop.get_exception_handler()
    loop.set_exception_handler(quiet_loop_errors)
    if gate_factory is not None:
        gate = gate_factory(config)
    else:
        database = store_path(config, simulated_host(library_from(config.gate.nvml_library)))
        gate = Gate(
            config,
            Sampler.from_config(config),
            store=Store(database),
            runtimes=runtimes.runtime_for,
        )
    metrics = GateMetrics(gate)
    await gate.start()
    runners: list[Runner] = []
    agent: AgentResponder | None = None
    lines = []
    try:
        resolver = IdentityResolver(config.identities)
        links = list(gate.links.values())
        caps = _connection_caps(config, links)
        for i, link in enumerate(links):
            consumer = link.consumer
            cap, upstream_cap = caps[2 * i], caps[2 * i + 1]
            listener = ConsumerListener(gate, link, resolver, upstream_connections=upstream_cap)
            runner, bound = await _start_site(
                ListenerRunner(
                    listener.handle,
                    listener.dialect,
                    listener.close,
                    consumer.limits,
                    consumer.name,
                    cap,
                ),
                consumer.listen,
                consumer.name,
            )
            runners.append(runner)
            lines.append(
                f"gpugate: {consumer.name} listening on {_url(*bound)} -> {consumer.upstream.url}"
            )
        for consumer in config.consumers:
            if consumer.name not in gate.links:
                lines.append(
                    f"gpugate: {consumer.name} ({consumer.runtime}) is not fronted by this "
                    "version; its memory is observed and counted"
                )
        runner, bound = await _start_site(
            GuardedRunner(control_app(gate, metrics), CONTROL_LIMITS, "the control API", caps[-1]),
            config.gate.control,
            "the control API",
        )
        runners.append(runner)
        lines.append(f"gpugate: control on {_url(*bound)} (/metrics, /gate/v1/status)")
        if config.gate.agent_check is not None:
            agent = await _start_agent(gate, config.gate.agent_check)
            host, port = agent.bound
            shown = f"[{host}]" if ":" in host else host
            lines.append(f"gpugate: agent-check on {shown}:{port} (HAProxy agent-port)")
        if on_listening is not None:
            on_listening()
        missing = await _warm(gate, stop)
        if missing is None:
            return
        lines.append("gpugate: ready" + (f" ({'; '.join(missing)})" if missing else ""))
        if on_ready is not None:
            on_ready(lines)
        await _run_until(stop, reloads, gate, resolver, on_reloaded)
    finally:
        grace = gate.config.gate.shutdown_grace
        deadline = loop.time() + grace
        if agent is not None:
            # HAProxy keeps its last answer; its own check sees the listeners go.
            await agent.close()
        await _shut_down(runners, grace)
        if gate.store is not None:
            # The store's last write gets what the drain left of the grace (and at least
            # STORE_LAST_WRITE): a database that hangs cannot hold the exit past the grace
            # plus about a second.
            left = deadline - loop.time()
            gate.store.close_timeout = min(CLOSE_TIMEOUT, max(STORE_LAST_WRITE, left))
        await gate.close()
        loop.set_exception_handler(previous_handler)


async def _warm(gate: Gate, stop: asyncio.Event) -> list[str] | None:
    """Wait for the always_warm runtimes the gate starts (`ProcessStarts.warm`): those not
    up; None when the gate is stopped first."""
    warm = asyncio.ensure_future(gate.processes.warm())
    stopping = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait({warm, stopping}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopping.cancel()
        if not warm.done():
            warm.cancel()
    if warm.cancelled() or not warm.done():
        return None
    return warm.result()


async def _start_agent(gate: Gate, address: Address) -> AgentResponder:
    """The agent-check responder on `address` (`gate.agent_check`)."""
    agent = AgentResponder(gate, address)
    try:
        await agent.start()
    except OSError as exc:
        reason = os.strerror(exc.errno) if exc.errno else str(exc)
        raise ListenError(
            f"cannot listen for agent checks on {address.host}:{address.port}: {reason}"
        ) from exc
    return agent


async def _run_until(
    stop: asyncio.Event,
    reloads: asyncio.Queue[Config] | None,
    gate: Gate,
    resolver: IdentityResolver,
    on_reloaded: Callable[[], None] | None = None,
) -> None:
    if reloads is None:
        await stop.wait()
        return
    stopping = asyncio.ensure_future(stop.wait())
    try:
        while not stop.is_set():
            reload = asyncio.ensure_future(reloads.get())
            await asyncio.wait({stopping, reload}, return_when=asyncio.FIRST_COMPLETED)
            if reload.done():
                apply_reload(gate, resolver, reload.result())
                if on_reloaded is not None:
                    on_reloaded()
            else:
                reload.cancel()
    finally:
        stopping.cancel()


async def _shut_down(runners: list[Runner], grace: float) -> None:
    """Stop accepting, give in-flight requests `grace` seconds in all, then close."""
    await asyncio.gather(*(r.stop_accepting() for r in runners), return_exceptions=True)
    # The control API's requests are short; its streams need no grace.
    graces = [grace] * (len(runners) - 1) + [min(grace, CONTROL_GRACE)] if runners else []
    drained = await asyncio.gather(
        *(r.drain(g) for r, g in zip(runners, graces, strict=True)), return_exceptions=True
    )
    cut = sum(n for n in drained if isinstance(n, int))
    if cut:
        log.info("shutdown grace of %gs over: %d request(s) cut", grace, cut)
    await asyncio.gather(*(r.cleanup() for r in runners), return_exceptions=True)


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


def run_loop(main: Coroutine[object, object, None]) -> None:
    """Run the gate on uvloop where it is installed, else (or with GPUGATE_LOOP=asyncio)
    on asyncio's own loop. uvloop holds 1,000 streams with a far lower chunk p99 and serves
    small requests for less CPU each (docs/benchmarks.md)."""
    if os.environ.get("GPUGATE_LOOP", "uvloop") != "asyncio":
        try:
            import uvloop
        except ImportError:
            pass
        else:
            uvloop.run(main)
            return
    asyncio.run(main)


def run_serve(config_path: Path, runtimes: RuntimeRegistry = RUNTIMES) -> int:
    """The `gpugate serve` command: the file read with `runtimes`' table, each consumer
    fronted by its adapter."""
    from gpugate.config.loader import ConfigError, load_config_with_warnings

    configure_logging()
    try:
        loaded = load_config_with_warnings(config_path, runtimes=runtimes.table)
    except ConfigError as exc:
        print(exc, file=sys.stderr)
        return EXIT_CONFIG
    unset = unset_secrets(loaded.warnings)
    if unset:
        print(f"gpugate serve: {unset}", file=sys.stderr)
        return EXIT_CONFIG
    for warning in loaded.warnings:
        print(warning, file=sys.stderr)

    notifier = Notifier()

    async def main() -> None:
        stop = asyncio.Event()
        reloads: asyncio.Queue[Config] = asyncio.Queue()
        loop = asyncio.get_running_loop()
        watchdog: list[asyncio.Task[None] | None] = [None]

        def stopping() -> None:
            if not stop.is_set():
                notifier.stopping()
            stop.set()

        def hang_up() -> None:
            notifier.reloading()
            reload_file(config_path, reloads, runtimes.table)
            if reloads.empty():
                notifier.ready()  # invalid: the running configuration stays in force

        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(signum, stopping)
        loop.add_signal_handler(signal.SIGHUP, hang_up)

        def listening() -> None:
            # systemd's READY=1 once the listeners are up: a runtime's start, however long,
            # is not the gate's (its requests wait for it).
            notifier.ready()
            # Pinged from the loop itself: a wedged loop stops the pings.
            watchdog[0] = notifier.start_watchdog()

        def ready(lines: list[str]) -> None:
            # What start-up built lives as long as the process. Frozen, it is left out of
            # the collector's full passes, which otherwise walk all of it (10-20 ms, the
            # p99 of a busy listener; docs/benchmarks.md).
            gc.collect()
            gc.freeze()
            gc.set_threshold(*GC_THRESHOLDS)
            for line in lines:
                print(line, flush=True)

        try:
            await serve(
                loaded.config,
                stop,
                on_ready=ready,
                reloads=reloads,
                on_reloaded=notifier.ready,
                on_listening=listening,
                runtimes=runtimes,
            )
        finally:
            await stop_task(watchdog[0])

    try:
        run_loop(main())
    except ListenError as exc:
        print(f"gpugate serve: {exc}", file=sys.stderr)
        return 1
    return 0
