"""`python -m gpugate.sim.llamaserver [llama-server options] [--sim-...]`.

Runs like llama.cpp's `llama-server` (tools/server/server.cpp): with `-m FILE` one model,
loaded after the port is bound (`/health` answers 503 `Loading model` meanwhile) and held
in the simulated GPU until exit; without `-m`, router mode: `--models-dir DIR` lists
models, each loaded in a child process of its own (the same program, `-m PATH --host
127.0.0.1 --port P --alias NAME`), as server-models.cpp does. The process names itself
`llama-server`, and its /proc cmdline shows its llama-server options (not the `--sim-*`
ones). SIGTERM/SIGINT stop it (status 0); a second one exits 1 at once.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from collections.abc import Sequence
from pathlib import Path

from gpugate.sim.holder import set_cmdline, set_comm
from gpugate.sim.llamaserver.cli import Args, display_command, parse_args
from gpugate.sim.llamaserver.memory import PROCESS_NAME
from gpugate.sim.llamaserver.single import run_single
from gpugate.sim.shim import STATE_ENV

EXIT_USAGE = 1


def _state_dir(args: Args) -> Path | None:
    if args.sim_state_dir is not None:
        return args.sim_state_dir
    if os.environ.get(STATE_ENV):
        return Path(os.environ[STATE_ENV]).parent
    return None


def main(argv: Sequence[str] | None = None) -> int:
    """Run a simulated llama-server; the exit code."""
    words = list(sys.argv[1:] if argv is None else argv)
    try:
        args = parse_args(words)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    # A launcher's blocked stop signals are inherited across exec; a stop must still work.
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM, signal.SIGINT})
    set_comm(PROCESS_NAME)
    set_cmdline(display_command(words))
    state_dir = _state_dir(args)
    if args.model is None:
        from gpugate.sim.llamaserver.router import run_router

        return asyncio.run(run_router(args, state_dir, words))
    return run_single(args, state_dir)


if __name__ == "__main__":
    sys.exit(main())
