"""Where the configuration file is looked for when a command is not given one."""

from __future__ import annotations

import os
from pathlib import Path

DEFAULT_CONFIG_PATHS = (Path("consumers.yaml"), Path("/etc/gpugate/consumers.yaml"))


def default_config_path() -> Path:
    """$GPUGATE_CONFIG, else ./consumers.yaml, else /etc/gpugate/consumers.yaml."""
    env = os.environ.get("GPUGATE_CONFIG")
    if env:
        return Path(env)
    for candidate in DEFAULT_CONFIG_PATHS:
        if candidate.exists():
            return candidate
    return DEFAULT_CONFIG_PATHS[0]
