"""The `gpugate` command: check, status, serve, lease, admit, leases, events, envelopes,
evict, drain, undrain, pause, resume, sim run, demo.

Exit codes are commands/exits.py's (sysexits): 64 for a command line argparse refuses, 78
for a command that talks to the gate and finds no configuration file.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import NoReturn

from gpugate.commands.exits import Exit
from gpugate.config.paths import ConfigNotFound, default_config_path, required_config_path


class _Parser(argparse.ArgumentParser):
    """argparse's parser with EX_USAGE for a bad command line: argparse's own 2 means
    nothing to a caller that reads sysexits codes. Subcommands' parsers are this class too
    (add_subparsers takes the parent's class)."""

    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        self.exit(Exit.USAGE, f"{self.prog}: error: {message}\n")


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="gpugate",
        description="VRAM admission gate for GPU runtimes (Ollama, ComfyUI, whisper.cpp, ...).",
    )
    sub = parser.add_subparsers(dest="command", required=True)

    check = sub.add_parser("check", help="validate a consumers.yaml")
    check.add_argument(
        "file", nargs="?", type=Path, help="default: $GPUGATE_CONFIG or ./consumers.yaml"
    )

    status = sub.add_parser("status", help="the VRAM budget per GPU")
    status.add_argument("--json", action="store_true", help="machine-readable, in bytes")
    status.add_argument("--config", type=Path, help="consumers.yaml (for attribution)")
    status.add_argument(
        "--watch", action="store_true", help="redraw every second from the running gate"
    )

    serve = sub.add_parser("serve", help="run the gate")
    serve.add_argument("--config", type=Path, help="consumers.yaml")

    from gpugate.commands.lease import add_lease_parser

    add_lease_parser(sub)

    from gpugate.commands.admit import add_admit_parser

    add_admit_parser(sub)

    from gpugate.commands.views import add_view_parsers

    add_view_parsers(sub)

    from gpugate.commands.operator import add_operator_parsers

    add_operator_parsers(sub)

    from gpugate.commands.init import add_init_parser

    add_init_parser(sub)

    sim = sub.add_parser("sim", help="the simulated GPU host")
    sim_sub = sim.add_subparsers(dest="sim_command", required=True)
    sim_run = sim_sub.add_parser("run", help="start a simulated host from HOST.yaml")
    sim_run.add_argument("host_file", type=Path)
    sim_run.add_argument(
        "--state-dir", type=Path, help="where the device state lives (default: a temporary one)"
    )

    demo = sub.add_parser("demo", help="a simulated host with the gate in front of it")
    demo.add_argument(
        "--host-file", type=Path, help="default: the incident card of 2026-07-10 (packaged)"
    )
    demo.add_argument("--config", type=Path, help="default: the demo's consumers.yaml (packaged)")
    demo.add_argument(
        "--two-cards",
        action="store_true",
        help="a host with two cards (24 GiB + 16 GiB): Ollama on both, models split over them",
    )
    demo.add_argument(
        "--port-base",
        type=int,
        metavar="N",
        help="move every port of the demo to N..N+8, in this order: Ollama through the gate, "
        "the simulated Ollama, ComfyUI through the gate, the simulated ComfyUI, whisper-server "
        "through the gate, the simulated one, mVoice through the gate, its upstream, the "
        "control listener (default: 11434 11435 8188 8189 8080 8081 7860 7861 9411)",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    words = sys.argv[1:] if argv is None else list(argv)
    # `admit CONSUMER ... -- CMD ARGS`: what follows `--` is the command, whatever it holds
    # (argparse cannot put a positional after options and a second positional list).
    command: list[str] = []
    if words[:1] == ["admit"] and "--" in words:
        at = words.index("--")
        words, command = words[:at], words[at + 1 :]
    args = _parser().parse_args(words)
    if args.command == "admit":
        args.argv = command
    try:
        return int(_dispatch(args))
    except ConfigNotFound as exc:
        print(f"gpugate {args.command}: {exc}", file=sys.stderr)
        return Exit.CONFIG


def _dispatch(args: argparse.Namespace) -> int:
    if args.command == "check":
        from gpugate.config.check import run_check

        return run_check(args.file or default_config_path())
    if args.command == "status" and args.watch:
        from gpugate.commands.views import run_watch

        return run_watch(required_config_path(args.config), as_json=args.json)
    if args.command == "status":
        from gpugate.commands.status import run_status

        return run_status(config_path=args.config, as_json=args.json)
    if args.command == "serve":
        from gpugate.serve import run_serve

        return run_serve(args.config or default_config_path())
    if args.command == "lease":
        from gpugate.commands.lease import run_lease

        return run_lease(args, required_config_path(args.config))
    if args.command == "admit":
        from gpugate.commands.admit import run_admit

        return run_admit(args, required_config_path(args.config))
    if args.command in ("leases", "events", "envelopes"):
        from gpugate.commands.views import run_view

        return run_view(args, required_config_path(args.config))
    if args.command in ("evict", "drain", "undrain", "pause", "resume"):
        from gpugate.commands.operator import run_operator

        return run_operator(args, required_config_path(args.config))
    if args.command == "sim":
        from gpugate.sim.host import run_host

        return run_host(args.host_file, state_dir=args.state_dir)
    if args.command == "demo":
        from gpugate.commands.demo import run_demo

        return run_demo(
            host_file=args.host_file,
            config_path=args.config,
            port_base=args.port_base,
            two_cards=args.two_cards,
        )
    if args.command == "init":
        from gpugate.commands.init import run_init

        return run_init(args)
    raise AssertionError(args.command)


if __name__ == "__main__":
    sys.exit(main())
