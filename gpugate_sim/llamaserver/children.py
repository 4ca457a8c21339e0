"""A router's model instances: one child llama-server process each (server-models.cpp).

The child is the same program, started with the router's own options plus `--host
127.0.0.1 --port P --alias NAME --model PATH` and `LLAMA_SERVER_ROUTER_PORT` in its
environment; its stdin and its combined stdout/stderr are pipes to the router. The router
learns the child's state from its `cmd_child_to_router:state:` lines, forwards its other
lines to its own log behind `[PORT] `, and asks it to stop by writing
`cmd_router_to_child:exit` to its stdin (SIGKILL after the stop timeout, 10 s; at once for
an instance still loading). Because the child exits when its stdin reaches EOF, a router
that dies, even by SIGKILL, takes its children with it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sys
import time
from collections.abc import Callable
from typing import Any

import attrs

from gpugate_sim.llamaserver.single import CHILD_EXIT, CHILD_STATE, ROUTER_PORT_ENV, log
from gpugate_sim.serverprocess import child_env, free_port

MODULE = "gpugate_sim.llamaserver"
PROGRAM = "llama-server"
"""The binary path the real router puts first (/proc/self/exe); the simulator's name."""
STOP_TIMEOUT = 10.0
UNLOADED, LOADING, LOADED = "unloaded", "loading", "loaded"


@attrs.define
class Instance:
    """One model of the router and, while it runs, its child process."""

    name: str
    path: str
    status: str = UNLOADED
    port: int = 0
    args: list[str] = attrs.field(factory=list)
    exit_code: int = 0
    last_used: float = 0.0
    req_count: int = 0
    loaded_info: dict[str, Any] = attrs.field(factory=dict)
    stopping: bool = False
    proc: asyncio.subprocess.Process | None = None

    @property
    def running(self) -> bool:
        return self.status in (LOADING, LOADED)

    @property
    def failed(self) -> bool:
        return self.status == UNLOADED and self.exit_code != 0


def args_of(instance: Instance, base_args: list[str] | None = None) -> list[str]:
    """`server_model_meta::update_args`: the child's command line (port 0 until spawned)."""
    if instance.args and base_args is None:
        return instance.args
    return [
        PROGRAM, "--host", "127.0.0.1", "--port", str(instance.port), "--alias", instance.name,
        "--model", instance.path, *(base_args or []),
    ]  # fmt: skip


async def spawn(
    instance: Instance,
    base_args: list[str],
    sim_args: list[str],
    router_port: int,
    on_change: Callable[[], None],
) -> None:
    """Start `instance`'s child (status `loading`) and watch it until it exits."""
    instance.port = free_port()  # common_http_get_free_port: a bind to port 0
    instance.args = args_of(instance, base_args)
    log(f"srv          load: spawning server instance with name={instance.name} on port "
        f"{instance.port}")  # fmt: skip
    instance.status, instance.exit_code, instance.loaded_info = LOADING, 0, {}
    instance.last_used = time.monotonic()
    instance.stopping = False
    env = child_env({**os.environ, ROUTER_PORT_ENV: str(router_port)})
    instance.proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", MODULE, *instance.args[1:], *sim_args,
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT, env=env,
    )  # fmt: skip
    asyncio.get_running_loop().create_task(_watch(instance, instance.proc, on_change))


async def _watch(
    instance: Instance, proc: asyncio.subprocess.Process, on_change: Callable[[], None]
) -> None:
    assert proc.stdout is not None
    while line := await proc.stdout.readline():
        text = line.decode(errors="replace").rstrip("\n")
        if text.startswith(CHILD_STATE):
            _on_state(instance, text[len(CHILD_STATE) :])
            on_change()
        elif text:
            log(f"[{instance.port:5d}] {text}")
    code = await proc.wait()
    if instance.proc is proc:
        instance.status, instance.exit_code, instance.stopping = UNLOADED, code, False
        instance.req_count = 0
        instance.proc = None
        log(f"srv    operator(): instance name={instance.name} exited with status {code}")
        on_change()


def _on_state(instance: Instance, raw: str) -> None:
    try:
        data = json.loads(raw)
    except ValueError:
        return
    payload = data.get("payload") or {}
    if data.get("state") == "ready":
        instance.status = LOADED
        if payload:
            instance.loaded_info = payload
    elif data.get("state") == "loading":
        instance.status = LOADING


async def stop(instance: Instance, timeout: float = STOP_TIMEOUT) -> None:
    """Ask the child to exit (kill it if it is still loading, or after `timeout`)."""
    proc = instance.proc
    if proc is None or instance.stopping:
        return
    instance.stopping = True
    if instance.status == LOADING:
        log(f"srv        unload: model name={instance.name} is still loading, force-killing")
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        return
    if proc.stdin is not None:
        with contextlib.suppress(OSError, ConnectionError):
            proc.stdin.write(f"{CHILD_EXIT}\n".encode())
            await proc.stdin.drain()
    asyncio.get_running_loop().create_task(_force_kill(instance, proc, timeout))


async def _force_kill(instance: Instance, proc: asyncio.subprocess.Process, timeout: float) -> None:
    try:
        await asyncio.wait_for(proc.wait(), timeout)
    except TimeoutError:
        log(f"srv          run: force-killing model instance name={instance.name} after timeout")
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
