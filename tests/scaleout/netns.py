"""Network namespaces joined by veth pairs, made and removed by a test.

Every address lives inside a namespace the test created (10.200.N.0/24, one subnet per
link); nothing is added to the namespace the test runs in. A process is started inside a
namespace with `ip netns exec`; the test's own connections into one are made from threads
that entered it (`setns`, per thread), so the event loop's thread never moves.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import ctypes
import os
import secrets
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Iterator, Sequence
from typing import TypeVar

import attrs

CLONE_NEWNET = 0x40000000
NETNS_DIR = "/run/netns"
T = TypeVar("T")


def unavailable() -> str | None:
    """Why namespaces cannot be made here (None: they can)."""
    if os.geteuid() != 0:
        return "network namespaces need root (CI runs the suite as root)"
    if shutil.which("ip") is None:
        return "no `ip` command (iproute2)"
    probe = f"ggprobe{secrets.token_hex(3)}"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if made.returncode != 0:
        return f"`ip netns add` fails: {made.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return None


def _ip(*args: str, namespace: str | None = None) -> None:
    argv = ["ip", *args] if namespace is None else ["ip", "-n", namespace, *args]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)}: {done.stderr.strip()}")


def _enter(name: str) -> None:
    """Move the calling thread into namespace `name` (its children are born there)."""
    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open(os.path.join(NETNS_DIR, name), os.O_RDONLY)
    try:
        if libc.setns(fd, CLONE_NEWNET) != 0:
            errno = ctypes.get_errno()
            raise OSError(errno, f"setns into {name}: {os.strerror(errno)}")
    finally:
        os.close(fd)


@attrs.define
class Namespace:
    """One network namespace, with threads inside it for the test's own connections."""

    name: str
    threads: int = 1
    _pool: concurrent.futures.ThreadPoolExecutor | None = None

    @property
    def pool(self) -> concurrent.futures.ThreadPoolExecutor:
        if self._pool is None:
            self._pool = concurrent.futures.ThreadPoolExecutor(
                self.threads,
                thread_name_prefix=f"netns-{self.name}",
                initializer=_enter,
                initargs=(self.name,),
            )
        return self._pool

    async def run(self, call: Callable[..., T], *args: object) -> T:
        """`call(*args)` on a thread inside the namespace."""
        return await asyncio.get_running_loop().run_in_executor(self.pool, call, *args)

    def argv(self, argv: Sequence[str]) -> list[str]:
        """`argv` run inside the namespace (`ip netns exec` execs it: same PID)."""
        return ["ip", "netns", "exec", self.name, *argv]

    def pids(self) -> list[int]:
        done = subprocess.run(
            ["ip", "netns", "pids", self.name], capture_output=True, text=True, timeout=30
        )
        return [int(p) for p in done.stdout.split()]

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None


@attrs.define
class Network:
    """A hub namespace linked to each of several host namespaces by a veth pair."""

    hub: Namespace
    hosts: list[Namespace]
    addresses: list[tuple[str, str]]
    """Per host: (the hub's address on its link, the host's address)."""


@contextlib.contextmanager
def star(hosts: int, *, hub_threads: int = 8) -> Iterator[Network]:
    """A hub namespace and `hosts` host namespaces, host i reachable from the hub at
    10.200.(i+1).2 (the hub is .1 on that link). Everything is removed afterwards, and
    whatever still runs inside them is killed first, even when the block failed."""
    tag = secrets.token_hex(2)
    hub = Namespace(f"gg{tag}hub", hub_threads)
    members = [Namespace(f"gg{tag}h{i}") for i in range(hosts)]
    made: list[Namespace] = []
    try:
        for namespace in (hub, *members):
            _ip("netns", "add", namespace.name)
            made.append(namespace)
            _ip("link", "set", "lo", "up", namespace=namespace.name)
        addresses = []
        for i, member in enumerate(members):
            near, far = f"gg{tag}v{i}a", f"gg{tag}v{i}b"
            subnet = f"10.200.{i + 1}"
            # Made inside the hub, so that not even for a moment is a link in ours.
            _ip("link", "add", near, "type", "veth", "peer", "name", far, namespace=hub.name)
            _ip("link", "set", far, "netns", member.name, namespace=hub.name)
            _ip("addr", "add", f"{subnet}.1/24", "dev", near, namespace=hub.name)
            _ip("addr", "add", f"{subnet}.2/24", "dev", far, namespace=member.name)
            _ip("link", "set", near, "up", namespace=hub.name)
            _ip("link", "set", far, "up", namespace=member.name)
            addresses.append((f"{subnet}.1", f"{subnet}.2"))
        yield Network(hub, members, addresses)
    finally:
        for namespace in made:
            namespace.close()
        for namespace in made:
            _kill_inside(namespace)
        for namespace in made:
            subprocess.run(["ip", "netns", "del", namespace.name], capture_output=True)


def _kill_inside(namespace: Namespace) -> None:
    """What the test started inside the namespace and left running (after a failure)."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        pids = namespace.pids()
        if not pids:
            return
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        deadline = time.monotonic() + 5
        while namespace.pids() and time.monotonic() < deadline:
            time.sleep(0.05)
