"""Where a command finds its configuration: one lookup, the same for every command that
reads one (`find_config`).

The file given on the command line (`--config FILE`, `gpugate check FILE`), else the file
$GPUGATE_CONFIG names, else the first of ./consumers.yaml and /etc/gpugate/consumers.yaml
that exists. A file that is named, on the command line or in $GPUGATE_CONFIG, and is not
there is an error naming it: the next place is never read instead, so that a typo cannot
send a command to another gate. ConfigNotFound is the command's exit 78 (EX_CONFIG). Only
`gpugate status` goes on without a file (`find_config_if_any`).
"""

from __future__ import annotations

import os
from pathlib import Path

CONFIG_ENV = "GPUGATE_CONFIG"
DEFAULT_CONFIG_PATHS = (Path("consumers.yaml"), Path("/etc/gpugate/consumers.yaml"))
"""Where a command looks when neither the command line nor $GPUGATE_CONFIG names a file."""


class ConfigNotFound(Exception):
    """No configuration file where one was named or looked for; str() names every place."""


def _there(path: Path) -> bool:
    """Whether something is at `path`; one that cannot be looked at (a directory this user
    may not search) counts as there, for the loader to say why it cannot be read."""
    try:
        os.stat(path)
    except (FileNotFoundError, NotADirectoryError):
        return False
    except OSError:
        return True
    return True


def find_config(given: Path | None = None, *, given_as: str | None = "--config") -> Path:
    """The configuration file a command reads: `given`, else $GPUGATE_CONFIG's, else the
    first of DEFAULT_CONFIG_PATHS that exists.

    Raises ConfigNotFound when `given` or $GPUGATE_CONFIG names a file that does not exist
    (`given_as`: how the command line names it, for the message), or when none is found.
    """
    found = find_config_if_any(given, given_as=given_as)
    if found is None:
        places = ", ".join(str(path.absolute()) for path in DEFAULT_CONFIG_PATHS)
        raise ConfigNotFound(
            f"no configuration file: ${CONFIG_ENV} is not set and none of {places} exists; "
            "give --config FILE"
        )
    return found


def find_config_if_any(
    given: Path | None = None, *, given_as: str | None = "--config"
) -> Path | None:
    """As find_config, but None when nothing names a file and none of the places has one
    (for `gpugate status`, which works without a configuration)."""
    if given is not None:
        if not _there(given):
            raise ConfigNotFound(
                f"{given_as} names {given}, which does not exist"
                if given_as
                else f"{given}: no such file"
            )
        return given
    env = os.environ.get(CONFIG_ENV)
    if env:
        if not _there(Path(env)):
            raise ConfigNotFound(f"${CONFIG_ENV} names {env}, which does not exist")
        return Path(env)
    return next((path for path in DEFAULT_CONFIG_PATHS if _there(path)), None)
