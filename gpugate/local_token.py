"""Tokens a command finds on this machine without being given one.

* The unit's credential: a command run by a systemd unit with
  `LoadCredential=gpugate-token:/etc/gpugate/admit.token` (whisper-server's
  `ExecStartPre=gpugate admit`) finds it in `$CREDENTIALS_DIRECTORY/gpugate-token`,
  readable by the unit's own user only. It comes before every other source.
* The local token: `gpugate demo` makes one, a random token in a file only its user can
  read (in $XDG_RUNTIME_DIR/gpugate/, else /tmp/gpugate-UID/), named in the demo gate's
  `control_tokens` as `file:PATH`. A command whose configuration names no control token and
  whose gate listens on loopback presents it, so the operator commands work against the
  demo as the README prints them.

The order a command looks in (gpugate.control_client): the unit's credential,
`$GPUGATE_TOKEN`, the first of the configuration's `gate.control_tokens` it can read, then
for a gate on loopback the local token.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import stat
import tempfile
from pathlib import Path

FILE_NAME = "control.token"
CREDENTIAL = "gpugate-token"
"""The credential name a unit gives the token its gpugate commands present."""


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


def local_token_path() -> Path:
    """Where this user's local control token lives (the directory is made 0700)."""
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    base = (
        Path(runtime) / "gpugate"
        if runtime
        else Path(tempfile.gettempdir()) / f"gpugate-{os.getuid()}"
    )
    return base / FILE_NAME


def write_local_token() -> Path:
    """A new random token in the local token file (0600); its path."""
    path = local_token_path()
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    info = path.parent.stat()
    if info.st_uid != os.getuid() or stat.S_IMODE(info.st_mode) & 0o077:
        raise PermissionError(f"{path.parent} is not this user's alone: no token written there")
    path.unlink(missing_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(secrets.token_hex(32) + "\n")
    return path


def read_local_token() -> str | None:
    """The local token, when this user has one."""
    with contextlib.suppress(OSError, UnicodeDecodeError):
        return local_token_path().read_text().strip() or None
    return None


def remove_local_token(path: Path) -> None:
    """Forget the token written at `path` (the demo stopped)."""
    path.unlink(missing_ok=True)
