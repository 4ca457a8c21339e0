"""Starting a runtime that was started by hand again on loopback: in the directory it was
started in, with the environment it has, as the user it runs as.

A runtime started outside systemd reads its environment (Ollama's `OLLAMA_MODELS`,
`OLLAMA_ORIGINS` and the rest of its `envconfig`, `CUDA_VISIBLE_DEVICES`, `HF_HOME`, `HOME`
for `~/.ollama`) and resolves relative paths (a `-m` model file, ComfyUI's `main.py`)
against its working directory. The command init proposes keeps both:

* its whole environment, as /proc/PID/environ shows it, goes into `NAME.env` beside the
  other files (mode 0600, owned by the user the runtime runs as), and the command runs
  under `env -i` with that file's variables and the address the move changes, nothing
  else: nothing of the shell the command is typed in leaks in (a `CUDA_VISIBLE_DEVICES`
  there would hide cards from it) and nothing it had is lost. The values are never
  printed: the dry run shows the file with the value of every variable named like a
  secret (`…TOKEN`, `…KEY`, `…SECRET`, `…PASSWORD`, `…AUTH…`, `…CREDENTIAL…`, `…COOKIE…`) as
  ***; the file written holds them.
* it changes to its working directory (/proc/PID/cwd) first.

The undo is the same command with the runtime's own command line and address: it starts
it as it was.
"""

from __future__ import annotations

import os
import pwd
import re
import shlex
from collections.abc import Mapping, Sequence
from pathlib import Path

import attrs

from gpugate.init.proc import HIDDEN, Process, redact

ENV_SUFFIX = ".env"
SHELL = "/bin/sh"
READ_THEN_EXEC = """'. "$0" && exec "$@"'"""
"""The script `sh -c` runs: read the environment file it is given as $0, then become the
command that follows."""
_SECRET_NAME = re.compile(r"(?i)(token|key|secret|passw|auth|credential|cookie|session)")
_SHELL_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def secret_named(name: str) -> bool:
    """Whether a variable's name says its value is a secret (HF_TOKEN, OPENAI_API_KEY)."""
    return bool(_SECRET_NAME.search(name))


@attrs.frozen
class HandStart:
    """How one runtime started by hand is started again, and started as it was."""

    name: str
    """The consumer's name: its environment file is NAME.env."""
    process: Process
    env_path: Path | None
    """Where its environment file is read from (absolute); None when /proc did not show its
    environment."""

    @property
    def env_file(self) -> str:
        """The file's name under --out."""
        return self.name + ENV_SUFFIX

    @property
    def user(self) -> str | None:
        """The user it runs as, when that is not the one init runs as."""
        uid = self.process.uid
        if uid is None or uid == os.geteuid():
            return None
        try:
            return pwd.getpwuid(uid).pw_name
        except KeyError:
            return f"uid {uid}"

    def command(self, argv: Sequence[str], changed: Sequence[tuple[str, str]] = ()) -> str:
        """One shell command that starts `argv` where, and with what, it was started, the
        variables `changed` set on top (secret-looking options of `argv` shown as ***)."""
        words = list(redact(argv))
        assignments = [f"{key}={value}" for key, value in changed]
        if self.env_path is not None:
            # The file is the script's $0 and the command its arguments: quoted once.
            then = ["env", *assignments] if assignments else []
            start = f"env -i {SHELL} -c {READ_THEN_EXEC} " + shlex.join(
                [str(self.env_path), *then, *words]
            )
        else:
            start = shlex.join([*assignments, *words])
        cwd = self.process.cwd
        return f"cd {shlex.quote(str(cwd))} && {start}" if cwd is not None else start

    @property
    def hidden_options(self) -> bool:
        return HIDDEN in redact(self.process.argv)

    def notes(self) -> list[str]:
        """What the command cannot carry over."""
        notes = []
        if self.process.env is None:
            notes.append(
                "its environment could not be read (run init as root, or as its user): the "
                "command starts it with the environment of the shell it is typed in"
            )
        if self.process.cwd is None:
            notes.append(
                "its working directory could not be read: run the command where it was "
                "started, or relative paths on its command line resolve elsewhere"
            )
        return notes


def env_file_text(hand: HandStart, *, shown: bool) -> str:
    """The environment file: `export NAME='value'` lines a shell reads with `.`.

    `shown`: for printing, every secret-looking value as ***."""
    env: Mapping[str, str] = hand.process.env or {}
    pid = hand.process.pid
    lines = [
        f"# The environment of {hand.name} (pid {pid}) as /proc/{pid}/environ showed it,",
        "# written by `gpugate init` for the commands in moves.txt that start it again.",
        "# Mode 0600: it may hold secrets.",
    ]
    if shown:
        lines.append(f"# Printed with the values of variables named like secrets as {HIDDEN}.")
    skipped = sorted(name for name in env if not _SHELL_NAME.match(name))
    if skipped:
        lines.append(
            "# Left out, as no shell can set them: " + ", ".join(shlex.quote(n) for n in skipped)
        )
    for name in sorted(env):
        if name in skipped:
            continue
        value = HIDDEN if shown and secret_named(name) else env[name]
        lines.append(f"export {name}={shlex.quote(value)}")
    return "\n".join(lines) + "\n"


def env_path(out: Path, name: str) -> Path:
    """Where NAME.env is read from by the commands: absolute, as they run elsewhere."""
    return Path(os.path.abspath(out)) / (name + ENV_SUFFIX)
