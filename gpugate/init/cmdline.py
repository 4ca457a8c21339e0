"""A command line read as the program it runs and that program's options."""

from __future__ import annotations

import os
import re
from collections.abc import Sequence

import attrs

_INTERPRETER = re.compile(r"^(python[0-9.]*|pypy[0-9.]*|node(js)?|bun)$")
_INTERPRETER_OPTIONS_WITH_VALUE = frozenset({"-X", "-W", "--check-hash-based-pycs"})


@attrs.frozen
class Program:
    """What a command line runs: `ollama`, `main.py`, `whisper-server`, a module's last part."""

    name: str
    word: str
    """The word as the command line writes it (a path, a module name)."""
    index: int
    """Its position in argv: the program's own arguments follow it."""
    module: str | None = None
    """The module of `python -m MODULE`."""

    def args(self, argv: Sequence[str]) -> tuple[str, ...]:
        return tuple(argv[self.index + 1 :])


def program_of(argv: Sequence[str]) -> Program | None:
    """The program a command line runs, looking through an interpreter (`python3 -m x.y`,
    `python3 /opt/ComfyUI/main.py`, `node server.js`)."""
    if not argv or not argv[0]:
        return None
    first = os.path.basename(argv[0])
    if not _INTERPRETER.match(first):
        return Program(first, argv[0], 0)
    i = 1
    while i < len(argv) and argv[i].startswith("-") and argv[i] != "-":
        word = argv[i]
        if word == "-m" and i + 1 < len(argv):
            module = argv[i + 1]
            return Program(module.rpartition(".")[2], module, i + 1, module)
        if word == "-c":
            return None
        i += 2 if word in _INTERPRETER_OPTIONS_WITH_VALUE else 1
    if i < len(argv):
        return Program(os.path.basename(argv[i]), argv[i], i)
    return None


def option(
    args: Sequence[str], names: Sequence[str], *, flag_value: str | None = None
) -> str | None:
    """The value of the last of `names` in `args` (`--port 8188`, `--port=8188`).

    `flag_value`: what an option given without a value means (ComfyUI's bare `--listen`).
    """
    found: str | None = None
    for i, word in enumerate(args):
        for name in names:
            if word == name:
                following = args[i + 1] if i + 1 < len(args) else None
                if following is not None and not following.startswith("-"):
                    found = following
                elif flag_value is not None:
                    found = flag_value
            elif word.startswith(name + "=") and name.startswith("--"):
                found = word.split("=", 1)[1]
    return found


def has_flag(args: Sequence[str], names: Sequence[str]) -> bool:
    return any(word in names or word.split("=", 1)[0] in names for word in args)
