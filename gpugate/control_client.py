"""The client side of the control API, shared by the commands that talk to the running gate.

The gate's address comes from the same consumers.yaml the gate reads (`gate.control`).
The token, the first found of: the unit's credential `$CREDENTIALS_DIRECTORY/gpugate-token`
(`LoadCredential=gpugate-token:PATH`), $GPUGATE_TOKEN, the first of `gate.control_tokens`
this user can read, and for a gate on loopback this user's local token of that gate's
control port (gpugate.local_token: what `gpugate demo` writes). Every way a call can fail
is a ControlFailure carrying its exit code (gpugate.exits).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import aiohttp

from gpugate.exits import Exit, for_answer
from gpugate.local_token import read_credential_token, read_local_token

if TYPE_CHECKING:
    from gpugate.config.model import Config

TOKEN_ENV = "GPUGATE_TOKEN"
LEASES = "/gate/v1/leases"


class ControlFailure(Exception):
    """The gate refused or could not be asked; str() is one line, the failure class first."""

    def __init__(self, message: str, code: Exit) -> None:
        super().__init__(message)
        self.code = code


class Unreachable(ControlFailure):
    """Nothing answered at the control address: refused, reset, unresolvable or silent."""


def unreachable(url: str, exc: BaseException) -> Unreachable:
    """The failure for `exc`, naming the address and the reason in a few words."""
    os_error = getattr(exc, "os_error", exc)
    number = getattr(os_error, "errno", None)
    # aiohttp's own strerror ("Connect call failed (...)") repeats the address; a name
    # that does not resolve has a negative (getaddrinfo) number and its own strerror.
    if isinstance(number, int) and number > 0:
        reason = os.strerror(number)
    else:
        reason = getattr(os_error, "strerror", None)
    return Unreachable(
        f"no gate answers at {url} ({reason or exc.__class__.__name__})", Exit.UNAVAILABLE
    )


def not_a_gate(url: str, status: int) -> ControlFailure:
    """An answer that is not JSON: the gate failed (5xx), or what answers at the address is
    another server."""
    if status >= 500:
        return ControlFailure(f"the gate at {url} failed (HTTP {status})", Exit.UNAVAILABLE)
    return ControlFailure(
        f"what answers at {url} is not a gpugate control listener (HTTP {status}, not JSON)",
        Exit.UNAVAILABLE,
    )


def refusal(status: int, answer: object) -> ControlFailure:
    """The gate's error answer as one line, the failure class first, with its exit code."""
    error = answer.get("error", {}) if isinstance(answer, dict) else {}
    error = error if isinstance(error, dict) else {}
    failure = error.get("class")
    shown = failure or f"HTTP {status}"
    message = " ".join(str(error.get("message", "")).split())
    code = for_answer(status, failure)
    if message.startswith(f"{shown}:"):
        return ControlFailure(message, code)  # the gate's messages start with their class
    return ControlFailure(f"{shown}: {message}" if message else shown, code)


def control_address(config_path: Path) -> tuple[str, str | None]:
    """The control API's URL and the token to present, from the configuration.

    Raises gpugate.config.loader.ConfigError when the file cannot be loaded.
    """
    from gpugate.config.loader import load_config_with_warnings

    return control_endpoint(load_config_with_warnings(config_path).config)


def control_endpoint(config: Config) -> tuple[str, str | None]:
    """The control API's URL and the token to present, from a loaded configuration."""
    address = config.gate.control
    host = address.host or "127.0.0.1"
    if host in ("0.0.0.0", "::"):
        host = "127.0.0.1" if host == "0.0.0.0" else "::1"
    shown = f"[{host}]" if ":" in host else host
    token = (
        read_credential_token()
        or os.environ.get(TOKEN_ENV)
        or next(iter(config.gate.control_tokens), None)
    )
    if token is None and host in ("127.0.0.1", "::1", "localhost"):
        # A gate on this machine started by this user (`gpugate demo`) left its token here,
        # under its control port: another demo's gate has its own.
        token = read_local_token(address.port)
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
    status, answer = await call(session, url, "POST", LEASES, json=body)
    if status not in (200, 201) or not isinstance(answer, dict) or "id" not in answer:
        raise refusal(status, answer)
    return answer


async def call(
    session: aiohttp.ClientSession, url: str, method: str, path: str, **kwargs: Any
) -> tuple[int, Any]:
    """One request on the control API: its status and JSON answer; ControlFailure when
    nothing answers, or what answers does not answer JSON."""
    try:
        async with session.request(method, path, **kwargs) as resp:
            status = resp.status
            try:
                answer = await resp.json(content_type=None)
            except ValueError:
                raise not_a_gate(url, status) from None
    except (aiohttp.ClientError, OSError, TimeoutError) as exc:
        raise unreachable(url, exc) from None
    return status, answer
