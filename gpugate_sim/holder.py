"""A process that holds simulated VRAM, as whisper-server, ComfyUI or a Plex transcode would.

    python -m gpugate_sim.holder --state-dir DIR --name NAME --bytes N [--gpu G] [--kind C]
        [--pulse-period SECONDS --pulse-bytes N] [--child JSON ...] [-- COMMAND WORDS ...]

A holder names itself NAME (its comm, cut to 15 characters as the kernel does), makes its
/proc cmdline read COMMAND WORDS (e.g. `whisper-server -m ggml-large-v3.bin --port 8081`)
so attribution rules match it like the real program, allocates N bytes on GPU G of the
simulated host in DIR under its own PID, starts its children, prints `READY <pid>` on
stdout and holds until SIGTERM or SIGINT. Then it stops its children, releases, exits 0.

* Out of memory: `OOM <message>` on stderr and exit code 3, like a CUDA program aborting.
* Children (`--child`, a holder description in JSON, repeatable) are started as this
  process's own children, so their PPid is this holder's PID, as Ollama's runners are
  children of `ollama serve`. READY comes after every child is ready; a child that fails
  makes this holder fail with the child's exit code.
* Pulses (`--pulse-period P --pulse-bytes N`): a volatile external user such as a Plex
  transcode. After READY the holder takes N more bytes and holds them P seconds, gives them
  back and rests P seconds, and so on. Each change is announced on stdout as
  `PULSE ON <bytes>` or `PULSE OFF`; a pulse that does not fit prints `OOM <message>` on
  stderr and `PULSE OOM <bytes>` on stdout, and the holder carries on.
* A holder exits when its parent dies (PR_SET_PDEATHSIG), so a killed host leaves none behind.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import json
import os
import queue
import signal
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TextIO

import attrs

from gpugate.core.units import parse_duration, parse_size
from gpugate_sim.children import (
    DEFAULT_READY_TIMEOUT,
    DEFAULT_STOP_GRACE,
    EXIT_OOM,
    READY,
    ChildFailed,
    Event,
    Exited,
    ReadyProcess,
    Stopped,
    StopRequested,
    describe_exit,
    install_stop_handlers,
    stop_all,
)
from gpugate_sim.device import GpuOutOfMemory, SimulatedGpuHost
from gpugate_sim.scenario import HolderSpec

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2

_PR_SET_PDEATHSIG = 1
_PR_SET_NAME = 15
_COMM_LEN = 15


# -- describing a holder on a command line -----------------------------------------------------


def holder_argv(spec: HolderSpec, state_dir: Path, *, python: str = sys.executable) -> list[str]:
    """The command that starts `spec` (and, through it, its children) as a holder process."""
    argv = [
        python, "-m", "gpugate_sim.holder",
        "--state-dir", str(state_dir),
        "--name", spec.name,
        "--bytes", str(spec.bytes),
        "--gpu", str(spec.gpu),
        "--kind", spec.kind,
    ]  # fmt: skip
    if spec.pulse_period is not None:
        argv += ["--pulse-period", repr(spec.pulse_period), "--pulse-bytes", str(spec.pulse_bytes)]
    for child in spec.children:
        argv += ["--child", json.dumps(_spec_record(child))]
    return [*argv, "--", *display_command(spec)]


def display_command(spec: HolderSpec) -> tuple[str, ...]:
    """The command line a holder shows in /proc: its `command`, else its name."""
    return spec.command or (spec.name,)


def count_holders(specs: Sequence[HolderSpec]) -> int:
    """Holders in these specs, children included."""
    return sum(1 + count_holders(spec.children) for spec in specs)


def _spec_record(spec: HolderSpec) -> dict[str, Any]:
    record = attrs.asdict(spec, recurse=False)
    record["command"] = list(spec.command)
    record["children"] = [_spec_record(child) for child in spec.children]
    return record


def _spec_from_record(record: Any, where: str) -> HolderSpec:
    if not isinstance(record, dict):
        raise ValueError(f"{where}: expected a JSON object")
    fields = {f.name for f in attrs.fields(HolderSpec)}
    unknown = set(record) - fields
    if unknown:
        raise ValueError(f"{where}: unknown key(s) {', '.join(sorted(unknown))}")
    values = dict(record)
    values["command"] = tuple(str(word) for word in values.get("command", ()))
    values["children"] = tuple(
        _spec_from_record(child, f"{where}.children[{i}]")
        for i, child in enumerate(values.get("children", ()))
    )
    return HolderSpec(**values)


def _child_spec(text: str) -> HolderSpec:
    try:
        return _spec_from_record(json.loads(text), "--child")
    except (ValueError, TypeError) as exc:
        raise argparse.ArgumentTypeError(f"not a holder description: {exc}") from None


# -- what the process looks like in /proc ------------------------------------------------------


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def set_comm(name: str) -> None:
    """Set this process's comm (what /proc/<pid>/comm and `ps -o comm` show)."""
    encoded = name.encode()[:_COMM_LEN]
    if _libc().prctl(_PR_SET_NAME, ctypes.c_char_p(encoded), 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_NAME) failed")


def set_cmdline(words: Sequence[str]) -> bool:
    """Make /proc/self/cmdline read `words`, NUL-separated; False when they do not fit.

    The kernel shows the bytes between the stat fields arg_start and arg_end, the process's
    original argv strings; setproctitle-style, they are overwritten in place. The area is
    padded with NULs, so readers should drop empty trailing fields, as for any program
    that rewrites its title.
    """
    stat = Path("/proc/self/stat").read_bytes()
    fields = stat[stat.rindex(b")") + 2 :].split()
    # fields[0] is stat field 3 (state); arg_start and arg_end are fields 48 and 49.
    if len(fields) < 47:
        return False
    arg_start, arg_end = int(fields[45]), int(fields[46])
    data = b"".join(word.encode() + b"\0" for word in words)
    size = arg_end - arg_start
    if arg_start == 0 or len(data) > size:
        return False
    ctypes.memmove(arg_start, data.ljust(size, b"\0"), size)
    return True


def pose_as(program: str, argv: Sequence[str]) -> None:
    """Show this process as `program` run with the words of `argv`, its `--sim-*` options
    (and their values) left out: its comm and its /proc cmdline, so attribution rules match
    it as the real program."""
    shown = [program]
    skip = False
    for word in argv:
        if skip:
            skip = False
            continue
        if word.startswith("--sim-"):
            skip = "=" not in word
            continue
        shown.append(word)
    set_comm(program)
    set_cmdline(shown)


def die_with_parent() -> None:
    """Ask for SIGTERM when the parent exits; exit now if it already has."""
    parent = os.getppid()
    _libc().prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    if os.getppid() != parent:
        raise SystemExit(EXIT_FAILED)


# -- the holder itself -------------------------------------------------------------------------


class Holder:
    """One running holder: its allocation, its children, its pulses."""

    def __init__(
        self,
        spec: HolderSpec,
        state_dir: Path,
        events: queue.SimpleQueue[Event],
        *,
        ready_timeout: float = DEFAULT_READY_TIMEOUT,
        out: TextIO = sys.stdout,
        err: TextIO = sys.stderr,
    ) -> None:
        self.spec = spec
        self.state_dir = state_dir
        self.gpu_host = SimulatedGpuHost(state_dir)
        self.events = events
        self.ready_timeout = ready_timeout
        self.out = out
        self.err = err
        self.pid = os.getpid()
        self.children: list[ReadyProcess] = []
        self.pulse_held = False

    def run(self) -> int:
        """Allocate, start the children, announce READY, hold until stopped; the exit code."""
        try:
            if self.spec.bytes:
                self.gpu_host.allocate(
                    self.pid, self.spec.bytes, gpu=self.spec.gpu, kind=self.spec.kind,
                    name=self.spec.name,
                )  # fmt: skip
            self._start_children()
            self._say(f"{READY} {self.pid}")
            self._hold()
            return EXIT_OK
        except GpuOutOfMemory as exc:
            self._complain(f"OOM {exc}")
            return EXIT_OOM
        except ChildFailed as exc:
            self._complain(f"holder {self.spec.name}: child holder {exc}")
            return EXIT_OOM if exc.returncode == EXIT_OOM else EXIT_FAILED
        except (KeyError, ValueError) as exc:
            self._complain(f"holder {self.spec.name}: {exc}")
            return EXIT_FAILED
        except (Stopped, BrokenPipeError):
            return EXIT_OK
        finally:
            stop_all(self.children)
            try:
                self.gpu_host.release(self.pid)
            except (OSError, ValueError) as exc:
                # The host is gone or its state broken; exiting frees the memory anyway.
                self._complain(f"holder {self.spec.name}: could not release: {exc}")

    def _start_children(self) -> None:
        for spec in self.spec.children:
            child = ReadyProcess(spec.name, holder_argv(spec, self.state_dir), self.events)
            child.start()
            self.children.append(child)
            child.wait_ready(self.ready_timeout)

    def _hold(self) -> None:
        period = self.spec.pulse_period
        on_phase = False
        next_change = time.monotonic() if period is not None else None
        while True:
            timeout = None if next_change is None else max(0.0, next_change - time.monotonic())
            try:
                event = self.events.get(timeout=timeout)
            except queue.Empty:
                assert period is not None and next_change is not None
                on_phase = not on_phase
                self._pulse(on=on_phase)
                next_change += period
                continue
            if isinstance(event, StopRequested):
                return
            if isinstance(event, Exited):
                code = event.child.wait(timeout=DEFAULT_STOP_GRACE)
                self._complain(
                    f"holder {self.spec.name}: child holder {event.child.label} "
                    f"(pid {event.child.pid}) exited with {describe_exit(code)}"
                )

    def _pulse(self, *, on: bool) -> None:
        """Take the pulse bytes at the start of an on phase, give them back at its end."""
        nbytes = self.spec.pulse_bytes
        if not on:
            if self.pulse_held:
                self.gpu_host.release(self.pid, nbytes, gpu=self.spec.gpu)
                self.pulse_held = False
            self._say("PULSE OFF")
            return
        try:
            self.gpu_host.allocate(
                self.pid, nbytes, gpu=self.spec.gpu, kind=self.spec.kind, name=self.spec.name
            )
        except GpuOutOfMemory as exc:
            # A transcode that cannot start fails alone; the holder keeps its rhythm.
            self._complain(f"OOM {exc}")
            self._say(f"PULSE OOM {nbytes}")
            return
        self.pulse_held = True
        self._say(f"PULSE ON {nbytes}")

    def _say(self, line: str) -> None:
        self.out.write(line + "\n")
        self.out.flush()

    def _complain(self, line: str) -> None:
        with contextlib.suppress(OSError, ValueError):
            self.err.write(line + "\n")
            self.err.flush()


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m gpugate_sim.holder",
        description="Hold simulated VRAM until SIGTERM, like a GPU program.",
    )
    parser.add_argument("--state-dir", type=Path, required=True, help="the simulated host")
    parser.add_argument("--name", required=True, help="process name (comm, 15 characters)")
    parser.add_argument("--bytes", type=parse_size, default=0, help="VRAM to hold: 2GiB, 512MB")
    parser.add_argument("--gpu", type=int, default=0)
    parser.add_argument("--kind", choices=("C", "G", "CG"), default="C")
    parser.add_argument("--pulse-period", type=parse_duration, help="seconds on, then off")
    parser.add_argument("--pulse-bytes", type=parse_size, default=0, help="VRAM of one pulse")
    parser.add_argument("--child", type=_child_spec, action="append", default=[])
    parser.add_argument("--ready-timeout", type=float, default=DEFAULT_READY_TIMEOUT)
    parser.add_argument("command", nargs="*", help="what /proc/<pid>/cmdline shows (after --)")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run a holder; the exit code."""
    events: queue.SimpleQueue[Event] = queue.SimpleQueue()
    install_stop_handlers(events)
    die_with_parent()
    args = _parser().parse_args(argv)
    if (args.pulse_period is None) != (args.pulse_bytes == 0) or (
        args.pulse_period is not None and args.pulse_period <= 0
    ):
        print("holder: --pulse-period (positive) and --pulse-bytes go together", file=sys.stderr)
        return EXIT_USAGE
    if not SimulatedGpuHost(args.state_dir).state_path.exists():
        print(f"holder: no simulated host in {args.state_dir}", file=sys.stderr)
        return EXIT_FAILED
    spec = HolderSpec(
        name=args.name,
        bytes=args.bytes,
        gpu=args.gpu,
        command=tuple(args.command),
        kind=args.kind,
        children=tuple(args.child),
        pulse_period=args.pulse_period,
        pulse_bytes=args.pulse_bytes,
    )
    set_comm(spec.name)
    set_cmdline(display_command(spec))
    holder = Holder(spec, args.state_dir, events, ready_timeout=args.ready_timeout)
    return holder.run()


if __name__ == "__main__":
    sys.exit(main())
