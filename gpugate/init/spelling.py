"""How init spells what it writes: YAML scalars, sizes, systemd words, comments."""

from __future__ import annotations

import json
import re
from collections.abc import Iterable

import yaml

from gpugate.core.units import GiB
from gpugate.init.plan import mib

_PLAIN = re.compile(r"^[A-Za-z0-9_./@-][A-Za-z0-9_./@:+-]*$")
_SYSTEMD_PLAIN = re.compile(r"^[A-Za-z0-9_@%+=:,./-]+$")


def scalar(text: str) -> str:
    """`text` as a YAML scalar: plain where YAML reads it back unchanged, else quoted."""
    if _PLAIN.match(text):
        try:
            if yaml.safe_load(text) == text:
                return text
        except yaml.YAMLError:
            pass
    return json.dumps(text)


def size(nbytes: int) -> str:
    """A size as the configuration writes it: whole GiB, else whole MiB (rounded up)."""
    if nbytes and nbytes % GiB == 0:
        return f"{nbytes // GiB}GiB"
    return f"{mib(nbytes)}MiB"


def systemd_word(word: str) -> str:
    """One word of a systemd command line: `%` and `$` doubled, quoted when it must be."""
    escaped = word.replace("%", "%%").replace("$", "$$")
    if _SYSTEMD_PLAIN.match(escaped):
        return escaped
    return '"' + escaped.replace("\\", "\\\\").replace('"', '\\"') + '"'


def systemd_command(argv: Iterable[str]) -> str:
    return " ".join(systemd_word(word) for word in argv)


def comment_lines(text: str, indent: str = "", width: int = 92) -> list[str]:
    """`text` as `# ` comment lines of at most about `width` characters."""
    lines: list[str] = []
    current = ""
    for word in text.split():
        if current and len(indent) + 2 + len(current) + 1 + len(word) > width:
            lines.append(f"{indent}# {current}")
            current = word
        else:
            current = f"{current} {word}" if current else word
    if current:
        lines.append(f"{indent}# {current}")
    return lines


def with_comment(line: str, comment: str, column: int = 36) -> str:
    """`line  # comment`, the comment at `column` where the line leaves room (YAML needs a
    space before a comment's `#`)."""
    return f"{line.ljust(column - 2)}  # {comment}" if comment else line
