"""Where the configuration file is looked for when a command is not given one."""

from __future__ import annotations

import os
from pathlib import Path

CONFIG_ENV = "GPUGATE_CONFIG"
DEFAULT_CONFIG_PATHS = (Path("consumers.yaml"), Path("/etc/gpugate/consumers.yaml"))


class ConfigNotFound(Exception):
    """No configuration file where one is looked for; str() names every place looked in."""


def default_config_path() -> Path:
    """$GPUGATE_CONFIG, else ./consumers.yaml, else /etc/gpugate/consumers.yaml."""
    return find_config_path() or DEFAULT_CONFIG_PATHS[0]


def find_config_path() -> Path | None:
    """As default_config_path(), but None when neither default file exists."""
    env = os.environ.get(CONFIG_ENV)
    if env:
        return Path(env)
    return next((path for path in DEFAULT_CONFIG_PATHS if path.exists()), None)


def required_config_path(given: Path | None) -> Path:
    """`--config` when given, else the file found as default_config_path() finds it.

    Raises ConfigNotFound naming the places looked in, so that a command run from the
    wrong directory says where to put the file rather than that one name is missing.
    """
    if given is not None:
        return given
    env = os.environ.get(CONFIG_ENV)
    if env and not Path(env).exists():
        raise ConfigNotFound(f"${CONFIG_ENV} names {env}, which does not exist")
    found = find_config_path()
    if found is None:
        places = ", ".join(str(path.absolute()) for path in DEFAULT_CONFIG_PATHS)
        raise ConfigNotFound(
            f"no configuration file: ${CONFIG_ENV} is not set and none of {places} exists; "
            "give --config FILE"
        )
    return found
