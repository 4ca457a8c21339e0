"""The client side of the control API, shared by `gpugate lease` and `gpugate admit`.

The gate's address and the token come from the same consumers.yaml the gate reads
(`gate.control`, the first of `gate.control_tokens`), or the token from $GPUGATE_TOKEN;
for a gate on loopback whose configuration names none, this user's local token
(gpugate.local_token: what `gpugate demo` writes).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import aiohttp

from gpugate.local_token import read_local_token

EX_TEMPFAIL = 75
"""sysexits.h: no lease could be had now; systemd's Restart= and a caller's retry apply."""
TOKEN_ENV = "GPUGATE_TOKEN"
LEASES = "/gate/v1/leases"


class ControlFailure(Exception):
    """The gate refused or could not be asked; str() is one line, the failure class first."""


def control_address(config_path: Path) -> tuple[str, str | None]:
    """The control API's URL and the token to present, from the configuration.

    Raises gpugate.config.loader.ConfigError when the file cannot be loaded.
    """
    from gpugate.config.loader import load_config_with_warnings

    config = load_config_with_warnings(config_path).config
    address = config.gate.control
    host = address.host or "127.0.0.1"
    if host in ("0.0.0.0", "::"):
        host = "127.0.0.1" if host == "0.0.0.0" else "::1"
    shown = f"[{host}]" if ":" in host else host
    token = os.environ.get(TOKEN_ENV) or next(iter(config.gate.control_tokens), None)
    if token is None and host in ("127.0.0.1", "::1", "localhost"):
        # A gate on this machine started by this user (`gpugate demo`) left its token here.
        token = read_local_token()
    return f"http://{shown}:{address.port}", token


def control_session(url: str, token: str | None) -> aiohttp.ClientSession:
    """A session on the control API with the bearer token (no overall timeout: a lease
    request waits as long as the gate lets it)."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=10)
    return aiohttp.ClientSession(base_url=url, headers=headers, timeout=timeout)


async def ask_lease(
    session: aiohttp.ClientSession, url: str, body: dict[str, Any]
) -> dict[str, Any]:
    """POST a lease request and wait for the answer: the lease document (201, or 200 for a
    start lease already held); ControlFailure with the failure class otherwise."""
    try:
        async with session.post(LEASES, json=body) as resp:
            answer = await resp.json(content_type=None)
            status = resp.status
    except (aiohttp.ClientError, OSError) as exc:
        raise ControlFailure(f"cannot reach the gate at {url}: {exc}") from None
    except ValueError:
        raise ControlFailure(f"the gate at {url} did not answer with JSON") from None
    if status not in (200, 201) or not isinstance(answer, dict) or "id" not in answer:
        error = answer.get("error", {}) if isinstance(answer, dict) else {}
        failure = error.get("class", f"HTTP {status}")
        message = " ".join(str(error.get("message", "")).split())
        if message.startswith(f"{failure}:"):
            raise ControlFailure(message)  # the gate's messages start with their class
        raise ControlFailure(f"{failure}: {message}" if message else failure)
    return answer
