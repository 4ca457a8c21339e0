"""systemd's notify protocol without a dependency: one datagram per state to $NOTIFY_SOCKET.

`gpugate serve` says READY=1 once its listeners are up, STOPPING=1 when it shuts down,
RELOADING=1 then READY=1 around a SIGHUP reload, and WATCHDOG=1 every half of
$WATCHDOG_USEC from a task on the event loop, so a wedged loop stops the pings and
systemd restarts the service. Without $NOTIFY_SOCKET every call does nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import time

log = logging.getLogger("gpugate.serve")


class Notifier:
    """Sends states to the service manager (when there is one)."""

    def __init__(self, environ: dict[str, str] | None = None) -> None:
        env = os.environ if environ is None else environ
        address = env.get("NOTIFY_SOCKET", "")
        # An abstract socket's name starts with '@'; on the wire that is a NUL byte.
        self.address = "\0" + address[1:] if address.startswith("@") else address
        self.watchdog = _watchdog_seconds(env)

    @property
    def enabled(self) -> bool:
        return bool(self.address)

    def send(self, *states: str) -> None:
        """One datagram with `states` (e.g. "READY=1"); errors are logged, never raised."""
        if not self.address:
            return
        message = "\n".join(states).encode()
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
                sock.connect(self.address)
                sock.sendall(message)
        except OSError as exc:
            log.warning("cannot notify the service manager at %s: %s", self.address, exc)

    def ready(self) -> None:
        self.send("READY=1", "STATUS=listening")

    def stopping(self) -> None:
        self.send("STOPPING=1", "STATUS=stopping")

    def reloading(self) -> None:
        # systemd 253+ wants the monotonic time with RELOADING=1 (Type=notify-reload).
        usec = time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000
        self.send("RELOADING=1", f"MONOTONIC_USEC={usec}")

    async def keep_alive(self) -> None:
        """WATCHDOG=1 every half watchdog interval, until cancelled."""
        if not self.address or self.watchdog is None:
            return
        while True:
            self.send("WATCHDOG=1")
            await asyncio.sleep(self.watchdog / 2)

    def start_watchdog(self) -> asyncio.Task[None] | None:
        """Run `keep_alive` on the running loop (None when no watchdog is asked for)."""
        if not self.address or self.watchdog is None:
            return None
        return asyncio.create_task(self.keep_alive(), name="gpugate-watchdog")


async def stop_task(task: asyncio.Task[None] | None) -> None:
    if task is None:
        return
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


def _watchdog_seconds(env: os._Environ[str] | dict[str, str]) -> float | None:
    """$WATCHDOG_USEC in seconds, when it is meant for this process ($WATCHDOG_PID)."""
    raw = env.get("WATCHDOG_USEC")
    if not raw:
        return None
    pid = env.get("WATCHDOG_PID")
    if pid and pid != str(os.getpid()):
        return None
    try:
        usec = int(raw)
    except ValueError:
        return None
    return usec / 1e6 if usec > 0 else None
