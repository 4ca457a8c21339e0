"""llama-server's router listing (`GET /models`): every model it can run, with its status,
aliases and the arguments its own server starts with (server-models.cpp get_router_models).

Statuses: unloaded, loading, loaded, sleeping (a child that gave its weights back after
`--sleep-idle-seconds`), downloading, downloaded; a failed start is `unloaded` with
`failed: true` and its `exit_code`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import attrs

from gpugate.runtimes.base import AdapterError


class LlamaServerError(AdapterError):
    """llama-server answered something the gate cannot read."""


@attrs.frozen
class ModelEntry:
    """One model of the router's listing."""

    name: str
    status: str
    aliases: tuple[str, ...] = ()
    args: tuple[str, ...] = ()
    """The command line its own server starts with (`-m PATH`, `-c N`, ...)."""

    @property
    def running(self) -> bool:
        """What the router counts against `--models-max` (is_running)."""
        return self.status in ("loading", "loaded", "sleeping")

    def option(self, *names: str) -> str | None:
        """The value of the last of `names` in its arguments."""
        found = None
        for i, word in enumerate(self.args):
            if word in names and i + 1 < len(self.args):
                found = self.args[i + 1]
            for name in names:
                if name.startswith("--") and word.startswith(name + "="):
                    found = word.split("=", 1)[1]
        return found


@attrs.frozen
class Catalog:
    """The router's models by name, as last listed."""

    entries: tuple[ModelEntry, ...] = ()

    def resolve(self, name: str) -> ModelEntry | None:
        """The model a request's name means: its own name, else an alias (get_meta)."""
        for entry in self.entries:
            if entry.name == name:
                return entry
        for entry in self.entries:
            if name in entry.aliases:
                return entry
        return None

    def running(self) -> list[ModelEntry]:
        """The models that hold one of `--models-max`'s places."""
        return [e for e in self.entries if e.running]


def _strings(value: object) -> tuple[str, ...]:
    if isinstance(value, Sequence) and not isinstance(value, (str, bytes)):
        return tuple(str(v) for v in value if isinstance(v, str))
    return ()


def parse_models(data: object) -> Catalog:
    """The catalog in a `GET /models` answer; LlamaServerError for anything else."""
    rows = data.get("data") if isinstance(data, Mapping) else None
    if not isinstance(rows, list):
        raise LlamaServerError(f"/models answered no list of models: {str(data)[:200]}")
    entries = []
    for row in rows:
        if not isinstance(row, Mapping) or not isinstance(row.get("id"), str):
            raise LlamaServerError(f"/models listed a model without an id: {str(row)[:200]}")
        status = row.get("status")
        if isinstance(status, Mapping):
            value, args = str(status.get("value", "")), _strings(status.get("args"))
        else:
            # A single-model server lists its one model without a router's status.
            value, args = "loaded", ()
        entries.append(ModelEntry(row["id"], value, _strings(row.get("aliases")), args))
    return Catalog(tuple(entries))
