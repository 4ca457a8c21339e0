"""The gate (in this event loop, through `gpugate.serve.serve`) in front of the real
whisper-server, which it starts on demand as its consumer `whisper`, and of anything else
a caller adds to its consumers.

The server is the CPU build, so nothing of it is on the simulated card by itself: a shadow
(`GpuShadow`) holds on the card, for the server's PID, the envelope of the model the server
says it is loading, as a GPU build would (the gate waits for a start's and a switch's bytes
to show in NVML). What loads is read off the server's stderr (`loading model from '...'`),
which its command appends to a file.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import textwrap
from collections.abc import AsyncIterator
from pathlib import Path

import attrs

from gpugate.core.effects import Event, EventKind
from gpugate.core.units import MiB
from gpugate.gate.gate import Gate
from gpugate.runtimes.sections import load_config_text
from gpugate_sim.device import SimulatedGpuHost
from tests.ports import free_ports
from tests.serving import GATE_PREAMBLE, serving
from tests.whisper.conftest import LOADING, Models

START = 60.0
ENVELOPES = {"english": 100 * MiB, "english_other": 120 * MiB, "multilingual": 140 * MiB}
"""What each test model holds on the card (the shadow's numbers and the consumer's)."""

CONFIG = GATE_PREAMBLE


def whisper_yaml(listen: int, upstream: int, argv: list[str], log: Path, models: Models) -> str:
    """Consumer `whisper`: the gate runs `argv`, its stderr appended to `log`."""
    command = ["/bin/sh", "-c", f'exec "$0" "$@" 2>>{log}', *argv]
    envelopes = "".join(
        f"      {json.dumps(str(getattr(models, name)))}: {{envelope: {size // MiB}MiB}}\n"
        for name, size in ENVELOPES.items()
    )
    return textwrap.indent(
        textwrap.dedent(f"""\
          whisper:
            runtime: whisper
            listen: 127.0.0.1:{listen}
            upstream: http://127.0.0.1:{upstream}
            class: interactive
            envelope: 100MiB
            residency: {{policy: keep_warm, ttl: 10m}}
            processes: {{commands: ["whisper-server"]}}
            control:
              command: {json.dumps(command)}
              start_timeout: {START:g}s
              stop_timeout: 5s
              start_admission_timeout: {START:g}s
            models:
        """)
        + envelopes,
        "  ",
    )


def server_pid(upstream: int) -> int | None:
    """The whisper-server listening on `upstream` (found by its command line)."""
    found = server_pids(upstream)
    return found[0] if found else None


def loads_in(log: Path) -> list[str]:
    """The model paths a whisper-server log says it started to load, in order."""
    if not log.exists():
        return []
    lines = log.read_text(errors="replace").splitlines()
    return [line[len(LOADING) : -1] for line in lines if line.startswith(LOADING)]


class GpuShadow:
    """Holds on the simulated card what the real server would hold there: the envelope of
    the model it last said it is loading, for its PID, from the moment it says so."""

    def __init__(
        self, host: SimulatedGpuHost, upstream: int, log: Path, sizes: dict[str, int]
    ) -> None:
        self.host, self.upstream, self.log, self.sizes = host, upstream, log, sizes
        self.seen = 0
        self.pid: int | None = None

    def step(self) -> None:
        pid = server_pid(self.upstream)
        loading = loads_in(self.log)
        if pid is None or (pid == self.pid and len(loading) == self.seen) or not loading:
            return
        self.pid, self.seen = pid, len(loading)
        self.host.release(pid)
        self.host.allocate(pid, self.sizes.get(loading[-1], 0), name="whisper-server")

    async def run(self) -> None:
        while True:
            self.step()
            await asyncio.sleep(0.02)


@attrs.define
class Gated:
    gate: Gate
    port: int
    """The gate's whisper listener."""
    upstream: int
    log: Path
    events: list[Event]
    control: int

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def loads(self) -> list[str]:
        return loads_in(self.log)

    def granted(self, consumer: str = "whisper") -> list[str]:
        """The models leased for `consumer`, in grant order."""
        return [
            e.key.model
            for e in self.events
            if e.kind is EventKind.LEASE_GRANTED and e.key and e.key.consumer == consumer
        ]


def server_pids(upstream: int) -> list[int]:
    """Every whisper-server listening on `upstream` (found by its command line)."""
    needle = f"--port\0{upstream}\0".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cmdline = (entry / "cmdline").read_bytes()
            except OSError:
                continue
            if b"whisper-server" in cmdline and needle in cmdline:
                found.append(int(entry.name))
    return found


@attrs.frozen
class Setup:
    """A gate's configuration with the real whisper-server as consumer `whisper`."""

    text: str
    listen: int
    upstream: int
    control: int
    log: Path
    """whisper-server's stderr."""
    sizes: dict[str, int]
    """What each model holds on the card (the shadow's numbers)."""


def setup_for(
    binary: Path, models: Models, directory: Path, library: Path, *, extra: str = ""
) -> Setup:
    """The gate's configuration: the real whisper-server (`-m` the English model) as
    consumer `whisper`, and the consumers `extra` (YAML, indented as `whisper_yaml`'s)."""
    listen, upstream, control = free_ports(3)
    log = directory / "whisper.err"
    argv = [str(binary), "-m", str(models.english), "--host", "127.0.0.1",
            "--port", str(upstream), "-t", "1"]  # fmt: skip
    text = CONFIG.format(control=control, library=library)
    text += whisper_yaml(listen, upstream, argv, log, models) + extra
    sizes = {str(getattr(models, name)): size for name, size in ENVELOPES.items()}
    return Setup(text, listen, upstream, control, log, sizes)


@contextlib.asynccontextmanager
async def gate_before(
    binary: Path,
    models: Models,
    directory: Path,
    host: SimulatedGpuHost,
    library: Path,
    *,
    extra: str = "",
) -> AsyncIterator[Gated]:
    """The gate (`setup_for`'s) in this event loop, the shadow of whisper-server's memory
    beside it."""
    setup = setup_for(binary, models, directory, library, extra=extra)
    listen, upstream, control, log = setup.listen, setup.upstream, setup.control, setup.log
    config = load_config_text(setup.text, directory / "consumers.yaml")
    shadow = asyncio.create_task(GpuShadow(host, upstream, log, setup.sizes).run())
    try:
        async with serving(config, ready_within=30) as served:
            events: list[Event] = []
            served.gate.events.subscribe(events.append, routine=True)
            yield Gated(served.gate, listen, upstream, log, events, control)
    finally:
        shadow.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await shadow
