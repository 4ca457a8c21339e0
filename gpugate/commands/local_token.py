"""Tokens a command finds on this machine without being given one.

* The unit's credential: a command run by a systemd unit with
  `LoadCredential=gpugate-token:/etc/gpugate/admit.token` (whisper-server's
  `ExecStartPre=gpugate admit`) finds it in `$CREDENTIALS_DIRECTORY/gpugate-token`,
  readable by the unit's own user only. It comes before every other source.
* The local token of a gate: `gpugate demo` makes one for its gate, a random token in a
  file only its user can read, named by the gate's control port
  ($XDG_RUNTIME_DIR/gpugate/control-PORT.token, else /tmp/gpugate-UID/control-PORT.token),
  and names it in that gate's `control_tokens` as `file:PATH`. A command whose
  configuration names no control token and whose gate listens on loopback presents the
  one of that gate's port, so the operator commands work against the demo as the README
  prints them, and two demos on one host (on other ports) each keep their own.

A demo holds an exclusive lock (flock(2)) on its token file for as long as it runs: a
second demo on the same port finds it held and writes nothing (TokenInUse); a file left
by a demo that was killed is free, and is taken over. A demo removes only the file it
still holds, never one another demo wrote since.

The order a command looks in (control_client.py): the unit's credential,
`$GPUGATE_TOKEN`, the first of the configuration's `gate.control_tokens` it can read, then
for a gate on loopback the local token of its control port.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import secrets
import stat
import tempfile
from pathlib import Path

import attrs

CREDENTIAL = "gpugate-token"
"""The credential name a unit gives the token its gpugate commands present."""


class TokenInUse(Exception):
    """Another running gpugate demo holds the local token of this control port."""


@attrs.frozen
class LocalToken:
    """A local token this process wrote and holds (locked) until `remove_local_token`."""

    path: Path
    fd: int
    """The open, locked file: the lock lasts while it is open."""


def read_credential_token() -> str | None:
    """The first line of `$CREDENTIALS_DIRECTORY/gpugate-token`, when the unit running this
    command passes one (`LoadCredential=gpugate-token:PATH`)."""
    directory = os.environ.get("CREDENTIALS_DIRECTORY")
    if not directory:
        return None
    with contextlib.suppress(OSError, UnicodeDecodeError):
        # As a `file:` token is read: the first line, trimmed.
        lines = (Path(directory) / CREDENTIAL).read_text(encoding="utf-8").strip().splitlines()
        return lines[0].strip() if lines else None
    return None


def local_token_dir() -> Path:
    """Where this user's local control tokens live (made 0700 when one is written)."""
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime:
        return Path(runtime) / "gpugate"
    return Path(tempfile.gettempdir()) / f"gpugate-{os.getuid()}"


def local_token_path(port: int) -> Path:
    """The local token of the gate whose control listener is on `port`."""
    return local_token_dir() / f"control-{port}.token"


def write_local_token(port: int) -> LocalToken:
    """A new random token in the local token file of control port `port` (0600), locked
    until `remove_local_token`; TokenInUse when a running demo holds that file."""
    path = local_token_path(port)
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    info = path.parent.stat()
    if info.st_uid != os.getuid() or stat.S_IMODE(info.st_mode) & 0o077:
        raise PermissionError(f"{path.parent} is not this user's alone: no token written there")
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise TokenInUse(
                f"{path} is held by another running gpugate demo (control port {port})"
            ) from None
        if _same_file(fd, path):
            break
        # Removed by its holder between our open and our lock: open the path afresh.
        os.close(fd)
    os.fchmod(fd, 0o600)
    os.ftruncate(fd, 0)
    os.write(fd, (secrets.token_hex(32) + "\n").encode())
    os.fsync(fd)
    return LocalToken(path, fd)


def read_local_token(port: int) -> str | None:
    """The local token of control port `port`, when this user has one."""
    with contextlib.suppress(OSError, UnicodeDecodeError):
        return local_token_path(port).read_text().strip() or None
    return None


def remove_local_token(token: LocalToken) -> None:
    """Forget a token this process wrote (its demo stopped): the file goes only while it
    is still the one written, then the lock is let go."""
    try:
        if _same_file(token.fd, token.path):
            token.path.unlink(missing_ok=True)
    finally:
        os.close(token.fd)


def _same_file(fd: int, path: Path) -> bool:
    try:
        there = path.stat(follow_symlinks=False)
    except FileNotFoundError:
        return False
    held = os.fstat(fd)
    return (there.st_dev, there.st_ino) == (held.st_dev, held.st_ino)
