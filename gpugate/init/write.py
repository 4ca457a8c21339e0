"""The files `gpugate init` writes, by path: consumers.yaml (consumers_yaml.py), one drop-in
per runtime unit and the gate's unit (unit_files.py), the environment of each runtime started
by hand (handstart.py), the moves (moves.py).

`render_files(plan)` returns them by path (under --out); `dry_run_text` prints them all,
each after a `==> PATH <==` line (as `head` prints several files), and `split_dry_run`
reads such a print back. `private_files(plan)` names those to write with mode 0600.
"""

from __future__ import annotations

import re

from gpugate.init.consumers_yaml import config_text
from gpugate.init.handstart import env_file_text
from gpugate.init.moves import moves_text
from gpugate.init.plan import CONFIG_FILE, GATE_UNIT_FILE, MOVES_FILE, Plan
from gpugate.init.unit_files import drop_in_text, gate_unit_text

__all__ = ["CONFIG_FILE", "MOVES_FILE", "dry_run_text", "render_files", "split_dry_run"]

HEADER = re.compile(r"^==> (?P<path>.+) <==$")


def render_files(plan: Plan, *, shown: bool = False) -> dict[str, str]:
    """Every file init writes, by its path under --out, in the order they are printed.

    `shown`: to print (the dry run): an environment file's secret-looking values as ***."""
    files = {CONFIG_FILE: config_text(plan)}
    for front in plan.fronts:
        if front.drop_in is not None:
            files[front.drop_in.path] = drop_in_text(front, plan.options)
    for front in plan.fronts:
        if front.hand is not None and front.hand.env_path is not None:
            files[front.hand.env_file] = env_file_text(front.hand, shown=shown)
    files[GATE_UNIT_FILE] = gate_unit_text(plan)
    files[MOVES_FILE] = moves_text(plan)
    return files


def private_files(plan: Plan) -> dict[str, int | None]:
    """The files to write with mode 0600 (a runtime's environment), by path, each with the
    user to own it (the runtime's, who runs the command that reads it; None: init's)."""
    return {
        front.hand.env_file: front.found.process.uid
        for front in plan.fronts
        if front.hand is not None and front.hand.env_path is not None
    }


def dry_run_text(files: dict[str, str]) -> str:
    """Every file, each after a `==> PATH <==` line."""
    parts = [f"==> {path} <==\n{text}" for path, text in files.items()]
    return "\n".join(parts)


def split_dry_run(text: str) -> dict[str, str]:
    """The files of a dry run's print, by path."""
    files: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in text.splitlines(keepends=True):
        match = HEADER.match(line.rstrip("\n"))
        if match:
            current = files.setdefault(match["path"], [])
            continue
        if current is not None:
            current.append(line)
    result = {}
    for path, lines in files.items():
        body = "".join(lines)
        # dry_run_text puts one blank line between files.
        result[path] = body[:-1] if body.endswith("\n\n") else body
    return result
