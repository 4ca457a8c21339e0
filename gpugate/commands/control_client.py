"""The client side of the control API, shared by the commands that talk to the running gate.

The gate's address comes from the same consumers.yaml the gate reads (`gate.control`).
The token, the first found of: the unit's credential `$CREDENTIALS_DIRECTORY/gpugate-token`
(`LoadCredential=gpugate-token:PATH`), $GPUGATE_TOKEN, the first of `gate.control_tokens`
this user can read, and for a gate on loopback this user's local token of that gate's
control port (local_token.py: what `gpugate demo` writes). Every way a call can fail
is a ControlFailure carrying its exit code (exits.py).

The actions (a lease, an admit, an operator's POST) go through `control_session` and
`call`; the reads (the views, `status --watch`) through `Control`, in `run_on_gate`, which
turns how the session ended into the command's exit code.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import aiohttp

from gpugate.commands.exits import INTERRUPTED, Exit, for_answer
from gpugate.commands.local_token import read_credential_token, read_local_token
from gpugate.core.explicit import IDENTITY_PREFIX

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
    from gpugate.runtimes.sections import load_config_with_warnings

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


# -- reading: the views and `status --watch` ------------------------------------------

READ_TIMEOUT = aiohttp.ClientTimeout(total=5.0, sock_connect=2.0)


class Control:
    """The running gate's control API, read-only."""

    def __init__(self, base: str, token: str | None, owners: Sequence[str] = ()) -> None:
        self.base = base
        self.headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.owners = tuple(owners)
        """The configured consumers and identities, as events name them."""

    @classmethod
    def from_config(cls, path: Path | None) -> Control:
        """The gate the configuration at `path` names (None: the defaults' gate)."""
        from gpugate.config.model import Config
        from gpugate.runtimes.sections import load_config_with_warnings

        config = load_config_with_warnings(path).config if path is not None else Config()
        base, token = control_endpoint(config)
        owners = [c.name for c in config.consumers]
        owners += [IDENTITY_PREFIX + i.name for i in config.identities]
        return cls(base, token, owners)

    async def _refused(self, r: aiohttp.ClientResponse) -> ControlFailure:
        try:
            return refusal(r.status, await r.json(content_type=None))
        except ValueError:
            return not_a_gate(self.base, r.status)

    async def get(self, session: aiohttp.ClientSession, path: str, **query: str) -> Any:
        try:
            async with session.get(self.base + path, params=query, headers=self.headers) as r:
                if r.status != 200:
                    raise await self._refused(r)
                if r.content_type == "application/x-ndjson":
                    return [json.loads(line) for line in (await r.text()).splitlines() if line]
                try:
                    return await r.json()
                except (ValueError, aiohttp.ContentTypeError):
                    raise not_a_gate(self.base, r.status) from None
        except (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError, TimeoutError) as exc:
            raise unreachable(self.base, exc) from exc

    async def follow(
        self, session: aiohttp.ClientSession, path: str, **query: str
    ) -> AsyncIterator[tuple[str, Any]]:
        """(event name, data) for each server-sent event until the gate ends the stream."""
        try:
            async with session.get(
                self.base + path,
                params=query,
                headers=self.headers,
                timeout=aiohttp.ClientTimeout(total=None, sock_connect=2.0),
            ) as r:
                if r.status != 200:
                    raise await self._refused(r)
                kind, data = "message", ""
                async for raw in r.content:
                    line = raw.decode().rstrip("\r\n")
                    if line == ": gpugate":
                        # The gate sends it once this stream is registered: from here on,
                        # nothing that happens is missed.
                        yield "open", None
                    elif line.startswith("event:"):
                        kind = line[6:].strip()
                    elif line.startswith("data:"):
                        data += line[5:].strip()
                    elif not line and data:
                        yield kind, json.loads(data)
                        kind, data = "message", ""
        except (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError, TimeoutError) as exc:
            raise unreachable(self.base, exc) from exc


def run_on_gate(
    name: str, config_path: Path | None, body: Callable[[Control, aiohttp.ClientSession], Any]
) -> int:
    """Run `body` on a session with the gate that `config_path` names: the exit code for
    how it ended, printing one line for a failure (`name` is the command's)."""
    from gpugate.config.loader import ConfigError

    try:
        control = Control.from_config(config_path)
    except ConfigError as exc:
        # Every issue, warnings too, as `gpugate check` prints them: the first line may
        # be a warning, and the error that stops the file further down.
        print(exc, file=sys.stderr)
        return Exit.CONFIG
    except OSError as exc:
        print(f"gpugate {name}: {exc}", file=sys.stderr)
        return Exit.CONFIG

    async def main() -> int:
        async with aiohttp.ClientSession(timeout=READ_TIMEOUT) as session:
            await body(control, session)
        return Exit.OK

    try:
        return asyncio.run(main())
    except ControlFailure as exc:
        print(f"gpugate {name}: {exc}", file=sys.stderr)
        return exc.code
    except KeyboardInterrupt:
        return INTERRUPTED
