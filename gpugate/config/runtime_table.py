"""The runtimes a configuration file may name, handed to the loader with each file.

config/ sits below runtimes/: it knows a runtime only by its name and the type of its own
section of a consumer. Whoever loads a file gives the loader a `RuntimeTable` (the shipped
one is `gpugate.runtimes.sections.RUNTIME_TABLE`), and what derives from it, the runtimes
with jobs and the runtimes a `runtime:` may name, is read from the table given, so a runtime
added to a table is read like any shipped one.
"""

from __future__ import annotations

import attrs

from gpugate.config.consumer import RuntimeSettings


@attrs.frozen
class RuntimeEntry:
    """One runtime a consumer may name (`runtime: NAME`), with its section (`NAME:`)."""

    name: str
    """As a file writes it after `runtime:`, in lower case."""
    section: type[RuntimeSettings] = RuntimeSettings
    """The type its section is read as; `RuntimeSettings` itself when it has no settings."""

    @property
    def jobs(self) -> bool:
        """Whether it queues jobs (a consumer's `preempt` applies to it)."""
        return self.section.jobs


def _distinct(table: RuntimeTable, attribute: attrs.Attribute, entries: tuple) -> None:
    names = [entry.name for entry in entries]
    for name in names:
        if name != name.strip().lower():
            raise ValueError(f"runtime name {name!r} must be lower case, without spaces around")
        if names.count(name) > 1:
            raise ValueError(f"runtime {name!r} is in the table twice")


@attrs.frozen
class RuntimeTable:
    """The runtimes a file may name, in the order messages list them."""

    entries: tuple[RuntimeEntry, ...] = attrs.field(converter=tuple, validator=_distinct)

    @property
    def names(self) -> tuple[str, ...]:
        """Every runtime's name."""
        return tuple(entry.name for entry in self.entries)

    @property
    def with_jobs(self) -> tuple[str, ...]:
        """The runtimes that queue jobs: those a consumer's `preempt` applies to."""
        return tuple(entry.name for entry in self.entries if entry.jobs)

    def section(self, name: str | None) -> type[RuntimeSettings] | None:
        """The type runtime `name`'s section is read as; None for a runtime not here."""
        for entry in self.entries:
            if entry.name == name:
                return entry.section
        return None

    def parse(self, text: str) -> str:
        """A runtime's name as written (any case, spaces around); ValueError for none here."""
        name = text.strip().lower()
        if self.section(name) is None:
            raise ValueError(f"unknown runtime {text!r} (one of {', '.join(self.names)})")
        return name

    def adding(self, entry: RuntimeEntry) -> RuntimeTable:
        """This table and `entry` after it."""
        return RuntimeTable((*self.entries, entry))
