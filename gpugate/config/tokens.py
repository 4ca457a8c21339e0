"""How a token in consumers.yaml is read (literal, `env:`, `file:`, `credential:`), and a scope."""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from pathlib import Path

from gpugate.config.model import Scope
from gpugate.config.scalars import Scalar, nonblank


class UnsetVariable(ValueError):
    """An `env:NAME` token whose variable is not set: the file is right, the environment
    is not (yet). `gpugate check` warns; `gpugate serve` refuses to start."""

    def __init__(self, name: str) -> None:
        super().__init__(f"environment variable {name} is not set")
        self.name = name


class UnreadableTokenFile(UnsetVariable):
    """A `file:PATH` token whose file cannot be read here (absent, or root's only): a
    warning from `gpugate check`, which may run as another user; `gpugate serve` refuses."""

    def __init__(self, path: str, reason: str) -> None:
        ValueError.__init__(self, f"token file {path} cannot be read ({reason})")
        self.name = f"file:{path}"


def _token_file(path: str) -> str:
    if not path:
        raise ValueError("expected a file path after 'file:'")
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise UnreadableTokenFile(path, exc.strerror or str(exc)) from None
    except UnicodeDecodeError:
        raise ValueError(f"token file {path} is not UTF-8 text") from None
    token = text.strip().splitlines()[0].strip() if text.strip() else ""
    if not token:
        raise ValueError(f"token file {path} is empty")
    return token


CREDENTIALS_DIRECTORY = "CREDENTIALS_DIRECTORY"
"""Where systemd puts a unit's credentials (`LoadCredential=ID:PATH`), readable by the
unit's own user, DynamicUser= included."""


class UnreadableCredential(UnreadableTokenFile):
    """A `credential:` token that neither the unit's credentials nor its fallback file give
    here: a warning from `gpugate check`; `gpugate serve` refuses."""

    def __init__(self, where: str, message: str) -> None:
        ValueError.__init__(self, message)
        self.name = f"file:{where}"


def _credential_name(name: str) -> str:
    if not name:
        raise ValueError("expected a credential name after 'credential:'")
    if "/" in name or name in (".", ".."):
        raise ValueError(f"credential name {name!r} is not a file name (no '/')")
    return name


def _token_credential(spec: str, environ: Mapping[str, str]) -> str:
    """`credential:NAME` or `credential:NAME:PATH`: the unit's credential NAME (systemd's
    `LoadCredential=NAME:PATH` puts it in `$CREDENTIALS_DIRECTORY`, readable by the unit's
    user, DynamicUser= included), else, with PATH, that file (a shell or `gpugate check`
    outside the unit, run by a user who may read it)."""
    name, _, fallback = spec.partition(":")
    name, fallback = _credential_name(name.strip()), fallback.strip()
    directory = environ.get(CREDENTIALS_DIRECTORY, "")
    if directory:
        path = Path(directory) / name
        if path.exists():
            return _token_file(str(path))
        missing = f"credential {name} is not in ${CREDENTIALS_DIRECTORY} ({directory})"
    else:
        missing = f"credential {name}: ${CREDENTIALS_DIRECTORY} is not set"
    load = f"LoadCredential={name}:{fallback or 'PATH'}"
    if not fallback:
        where = f"${CREDENTIALS_DIRECTORY}/{name}"
        raise UnreadableCredential(where, f"{missing}; the unit needs {load}")
    try:
        return _token_file(fallback)
    except UnreadableTokenFile as exc:
        message = f"{missing}, and {exc}; the unit needs {load}"
        raise UnreadableCredential(fallback, message) from None


def read_token(text: str, environ: Mapping[str, str]) -> str:
    """A bearer token: literal text, `env:NAME` for that environment variable's value,
    `file:PATH` for the file's first line, or `credential:NAME[:PATH]` for the unit's
    credential NAME (`$CREDENTIALS_DIRECTORY/NAME`), else the file PATH."""
    nonblank(text)
    if text.startswith("file:"):
        return _token_file(text.removeprefix("file:").strip())
    if text.startswith("credential:"):
        return _token_credential(text.removeprefix("credential:"), environ)
    if not text.startswith("env:"):
        return text
    name = text.removeprefix("env:").strip()
    if not name:
        raise ValueError("expected an environment variable name after 'env:'")
    if name not in environ:
        raise UnsetVariable(name)
    if not environ[name].strip():
        raise ValueError(f"environment variable {name} is empty")
    return environ[name]


def token_scalar(environ: Mapping[str, str]) -> Scalar:
    """How a token is read, its `env:` names resolved in `environ`."""
    return Scalar("a token", (str,), lambda text: read_token(text, environ))


def _scope(text: str) -> Scope:
    nonblank(text)
    try:
        return Scope.parse(text)
    except ValueError as exc:
        close = difflib.get_close_matches(text.strip().lower(), [s.value for s in Scope], n=1)
        if close:
            raise ValueError(f"{exc}; did you mean '{close[0]}'?") from None
        raise


SCOPE_SCALAR = Scalar(f"a scope ({', '.join(s.value for s in Scope)})", (str,), _scope)
