"""`gpugate init [--dry-run] [--out DIR] [--pid PID] [--proc-root PATH] [--nvml-library PATH]`.

Reads the host, prints (`--dry-run`) or writes into a new directory the consumers.yaml,
the drop-ins, the environment of each runtime started by hand (mode 0600, owned by its
user; printed with secret-looking values hidden) and the moves. It never writes under /etc
and never runs a move. The reading and proposing are gpugate.init's (scan, recognise,
plan, write, moves).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import sys
from pathlib import Path
from typing import TextIO

from gpugate.commands.exits import Exit

EXIT_CANTCREAT = 73
"""sysexits' EX_CANTCREAT: a file init would write is already there."""
DEFAULT_OUT = Path("gpugate-init")


def add_parser(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """`gpugate init`'s options."""
    init = subparsers.add_parser(
        "init", help="read this host and propose a consumers.yaml, drop-ins and the moves"
    )
    init.add_argument(
        "--dry-run", action="store_true", help="print every file and the moves; write nothing"
    )
    init.add_argument(
        "--out", type=Path, default=DEFAULT_OUT, metavar="DIR",
        help=f"where to write the files (default: ./{DEFAULT_OUT}; existing files are never "
        "overwritten)",
    )  # fmt: skip
    init.add_argument(
        "--proc-root", type=Path, default=Path("/proc"), metavar="PATH",
        help="the proc tree to read (default: /proc)",
    )  # fmt: skip
    init.add_argument(
        "--nvml-library", type=Path, metavar="PATH",
        help="a libnvidia-ml.so.1 to load instead of the driver's ($GPUGATE_NVML_LIBRARY)",
    )  # fmt: skip
    init.add_argument(
        "--control", metavar="ADDRESS",
        help="the gate's control listener (default: 127.0.0.1:9411, or the next free port)",
    )  # fmt: skip
    init.add_argument(
        "--database", metavar="PATH", default=None,
        help="the gate's SQLite file (default: /var/lib/gpugate/gpugate.db, the shipped "
        "unit's StateDirectory)",
    )  # fmt: skip
    init.add_argument(
        "--no-ask", action="store_true",
        help="do not ask a running Ollama which models it holds (GET /api/ps on loopback)",
    )  # fmt: skip
    init.add_argument(
        "--pid", type=int, action="append", default=[], metavar="PID",
        help="propose this runtime even though it runs in another network or PID namespace "
        "(repeat for several)",
    )  # fmt: skip


def _gpugate_program() -> str:
    """The gpugate program a drop-in's `gpugate admit` should run: this one."""
    argv0 = Path(sys.argv[0]) if sys.argv and sys.argv[0] else None
    if argv0 is not None and argv0.name == "gpugate" and argv0.exists():
        return str(argv0.absolute())
    found = shutil.which("gpugate")
    return found or "/usr/local/bin/gpugate"


def _under_etc(path: Path) -> bool:
    resolved = path.resolve()
    return resolved == Path("/etc") or Path("/etc") in resolved.parents


def _write_private(target: Path, text: str, uid: int | None) -> None:
    """A new file only its owner reads (mode 0600 from its creation), given to `uid` (the
    user whose runtime reads it) where init may."""
    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        fh.write(text)
    if uid is not None and uid != os.geteuid() and os.geteuid() == 0:
        with contextlib.suppress(OSError):
            os.chown(target, uid, -1)


def run(args: argparse.Namespace, out: TextIO | None = None, err: TextIO | None = None) -> int:
    """Scan, recognise, plan, then print or write."""
    from gpugate.config.model import Address
    from gpugate.init.plan import DEFAULT_DATABASE, Options
    from gpugate.init.planning import make_plan
    from gpugate.init.recognise import recognise
    from gpugate.init.scan import ask_ollama_ps, scan_host
    from gpugate.init.systemd import read_units
    from gpugate.init.write import dry_run_text, private_files, render_files

    out = sys.stdout if out is None else out
    err = sys.stderr if err is None else err
    if args.control is not None:
        try:
            Address.parse(args.control)
        except ValueError as exc:
            print(f"gpugate init: --control: {exc}", file=err)
            return Exit.USAGE
    if not args.dry_run and _under_etc(args.out):
        print(
            f"gpugate init: --out {args.out}: init never writes under /etc; write elsewhere "
            "and install the files with the moves it prints",
            file=err,
        )
        return Exit.USAGE
    options = Options(
        out=args.out,
        control=str(Address.parse(args.control)) if args.control is not None else None,
        database=args.database or DEFAULT_DATABASE,
        proc_root=args.proc_root if args.proc_root != Path("/proc") else None,
        nvml_library=args.nvml_library,
        gpugate=_gpugate_program(),
        ask_runtimes=not args.no_ask,
        named=frozenset(args.pid),
    )
    scan = scan_host(args.proc_root, args.nvml_library)
    if scan.nvml_error:
        print(f"gpugate init: NVML: {scan.nvml_error}", file=err)
    recognised = recognise(scan)
    wanted_units = [
        found.process.unit
        for found in (*recognised.runtimes, *recognised.external)
        if found.process.unit and not found.process.user_unit and not found.process.container
    ]
    units = read_units(wanted_units)
    loaded = {}
    if options.ask_runtimes:
        for found in recognised.runtimes:
            # Loopback here is only this network namespace's: an Ollama elsewhere is not
            # the one that would answer.
            if (
                found.kind == "ollama"
                and found.address is not None
                and not found.process.container
                and found.process.namespaces.same_net
            ):
                loaded[found.process.pid] = ask_ollama_ps(found.address.host, found.address.port)
    plan = make_plan(scan, recognised, units, options, loaded)
    if args.dry_run:
        out.write(dry_run_text(render_files(plan, shown=True)))
        out.flush()
        return Exit.OK
    files = render_files(plan)
    private = private_files(plan)
    targets = {path: args.out / path for path in files}
    existing = [str(target) for target in targets.values() if target.exists()]
    if existing:
        print(
            f"gpugate init: not overwriting {', '.join(existing)}; give another --out or "
            "move them away",
            file=err,
        )
        return EXIT_CANTCREAT
    for path, target in targets.items():
        target.parent.mkdir(parents=True, exist_ok=True)
        if path in private:
            _write_private(target, files[path], private[path])
        else:
            with open(target, "x", encoding="utf-8") as fh:
                fh.write(files[path])
        print(f"gpugate init: wrote {target}", file=out)
    print("", file=out)
    out.write(files["moves.txt"])
    out.flush()
    return Exit.OK
