"""`gpugate share [PATH] [--list]`: where the files the package carries are installed
(gpugate.packaged): the systemd unit and drop-ins, the alert rules, the Grafana dashboard
and deploy/. An operator who installed gpugate with pip finds them here, as

    sudo install -m 0644 "$(gpugate share systemd/gpugate.service)" /etc/systemd/system/
    helm install gpugate "$(gpugate share deploy/helm/gpugate)" -n gpugate
"""

from __future__ import annotations

import argparse
import sys
from typing import TextIO

from gpugate.commands.exits import Exit


def add_parser(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """`gpugate share`'s options."""
    share = subparsers.add_parser(
        "share",
        help="print where the packaged unit, drop-ins, alert rules, dashboard and deploy/ are",
    )
    share.add_argument(
        "path", nargs="?", default="", metavar="PATH",
        help="a file or directory under it, such as systemd/gpugate.service (default: the "
        "directory itself)",
    )  # fmt: skip
    share.add_argument(
        "--list", action="store_true", help="list every packaged file (under PATH, if given)"
    )


def run(args: argparse.Namespace, out: TextIO | None = None, err: TextIO | None = None) -> int:
    """Print the absolute path of PATH under the packaged files, or list them."""
    from gpugate.packaged import SHARE, listing, shared

    out = sys.stdout if out is None else out
    err = sys.stderr if err is None else err
    try:
        path = shared(args.path) if args.path else SHARE
    except (ValueError, FileNotFoundError) as exc:
        print(f"gpugate share: {exc} (gpugate share --list lists them)", file=err)
        return Exit.USAGE
    if args.list:
        prefix = path.relative_to(SHARE).as_posix() + "/" if path != SHARE else ""
        for name in listing():
            if name.startswith(prefix) or name == args.path:
                print(name, file=out)
        return Exit.OK
    print(path, file=out)
    return Exit.OK
