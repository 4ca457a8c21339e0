"""Read-only views of the running gate: `gpugate leases` (the leases in flight, and below
them the demands waiting, with what each waits for), `events`, `envelopes`. Tables for
people, `--json` for scripts; an error is one line on stderr with the exit code for what it
means (exits.py): 69 when no gate answers (or the gate ends a followed stream), 77 for a
token it refuses, 64 for a filter that names no class, 78 without a configuration.

The gate is found as `gpugate lease` finds it: the control address in the configuration
($GPUGATE_CONFIG, ./consumers.yaml, /etc/gpugate/consumers.yaml, or --config), and a
token from $GPUGATE_TOKEN or the configuration when reads are not public.
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TextIO

import aiohttp
import attrs

from gpugate.commands.control_client import Control, ControlFailure, run_on_gate
from gpugate.commands.exits import Exit
from gpugate.config.paths import find_config
from gpugate.core.classes import PriorityClass
from gpugate.core.effects import EventKind
from gpugate.core.failures import FailureClass
from gpugate.core.units import GiB, MiB


def add_parser(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """The `leases`, `events` and `envelopes` subcommands."""
    leases = subparsers.add_parser(
        "leases", help="the leases in flight on the running gate, and the demands waiting"
    )
    events = subparsers.add_parser("events", help="the gate's recent events, or follow them live")
    events.add_argument("--follow", "-f", action="store_true", help="go on printing new events")
    events.add_argument("--class", dest="priority", help="only requests of this priority class")
    events.add_argument("--consumer", help="only this consumer's events")
    events.add_argument("--failure", help="only failures of this class (`any`: every failure)")
    events.add_argument("--last", type=int, default=50, help="how many recent events (50)")
    envelopes = subparsers.add_parser("envelopes", help="measured envelopes: bytes, when, runtime")
    for parser in (leases, events, envelopes):
        parser.add_argument("--json", action="store_true", help="machine-readable")
        parser.add_argument("--config", type=Path, help="consumers.yaml (the control address)")


def _size(nbytes: int | None) -> str:
    if nbytes is None:
        return "-"
    return f"{nbytes / GiB:.2f} GiB" if abs(nbytes) >= GiB else f"{nbytes / MiB:.0f} MiB"


def _seconds(value: float | None) -> str:
    if value is None:
        return "-"
    if value < 120:
        return f"{value:.1f}s"
    return f"{value / 60:.0f}m" if value < 7200 else f"{value / 3600:.1f}h"


def _when(wall: float | None) -> str:
    if wall is None:
        return "-"
    return datetime.datetime.fromtimestamp(wall).strftime("%Y-%m-%d %H:%M:%S")


def table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """Columns padded to their widest cell; numbers are the caller's strings."""
    cells = [[str(h) for h in headers], *[[str(c) for c in row] for row in rows]]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    return "\n".join(
        "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        for row in cells
    )


# -- the views --------------------------------------------------------------------------


def leases_rows(status: dict[str, Any], listed: dict[str, Any]) -> list[dict[str, Any]]:
    """Every lease in flight with its scope, and an explicit lease's bytes and expiry."""
    extra = {x["id"]: x for x in listed.get("leases", [])}
    rows = []
    for lease in status.get("leases", []):
        more = extra.get(lease["id"], {})
        # A gate that lists only explicit leases names no scope: what it lists is explicit.
        # A lease missing from the listing ended between the two reads.
        scope = more.get("scope", "explicit") if more else "-"
        explicit = scope == "explicit"
        rows.append(
            {
                **lease,
                "scope": scope,
                "explicit": explicit,
                "bytes": more.get("bytes"),
                "expires_in": more.get("expires_in") if explicit else None,
            }
        )
    return rows


def render_leases(rows: list[dict[str, Any]]) -> str:
    if not rows:
        return "no lease in flight"
    return table(
        ("ID", "CONSUMER", "MODEL", "GPU", "CLASS", "SCOPE", "LOADING", "WAITED", "EXPIRES"),
        [
            (
                r["id"],
                r["consumer"],
                "(explicit)" if r["explicit"] else r["model"],
                r["gpu"],
                r["class"],
                r["scope"],
                _size(r["pending"]) if r["pending"] else "-",
                _seconds(r["waited_seconds"]),
                _seconds(r["expires_in"]),
            )
            for r in rows
        ],
    )


def render_queue(rows: list[dict[str, Any]]) -> str:
    """The waiting demands, each GPU's in its order, with what each waits for."""
    if not rows:
        return "nothing waits"
    return table(
        ("TICKET", "CONSUMER", "MODEL", "GPU", "CLASS", "POS", "WAITED", "DEADLINE", "WAITS FOR"),
        [
            (
                r["ticket"],
                r["consumer"],
                r["model"],
                r["gpu"],
                r["class"],
                r["position"],
                _seconds(r["waiting_seconds"]),
                f"in {_seconds(max(0.0, r['deadline_in_seconds']))}",
                f"{r.get('reason', '-')}: {r.get('line', '')}",
            )
            for r in rows
        ],
    )


def render_leases_and_queue(rows: list[dict[str, Any]], queue: list[dict[str, Any]]) -> str:
    """`gpugate leases`: the leases, then the demands waiting below them (when any)."""
    text = render_leases(rows)
    if queue:
        text += "\n\nwaiting:\n" + render_queue(queue)
    return text


def event_row(event: dict[str, Any]) -> tuple[object, ...]:
    failure = event.get("failure")
    what = f"FAILURE {failure}" if failure else event.get("event", "?")
    detail = event.get("message") or event.get("reason") or event.get("detail") or ""
    if not detail and event.get("bytes") is not None:
        detail = _size(event["bytes"])
    return (
        _when(event.get("time")),
        what,
        event.get("consumer") or "-",
        event.get("model") or "-",
        event.get("priority") or "-",
        detail,
    )


EVENT_HEADERS = ("TIME", "EVENT", "CONSUMER", "MODEL", "CLASS", "DETAIL")
MODEL_WIDTH = 24
"""A followed table's MODEL column before a longer name widens it."""


@attrs.define
class Columns:
    """A table printed a row at a time: each column as wide as any cell it will likely
    hold, and wider (never narrower) from the row that needs it, so that a followed
    table stays aligned. The last column is not padded."""

    widths: list[int]

    def line(self, cells: Sequence[object]) -> str:
        texts = [str(cell) for cell in cells]
        for i, text in enumerate(texts[:-1]):
            self.widths[i] = max(self.widths[i], len(text))
        padded = [text.ljust(width) for text, width in zip(texts, self.widths, strict=False)]
        return "  ".join([*padded[:-1], texts[-1]]).rstrip()


def event_columns(owners: Sequence[str]) -> Columns:
    """EVENT_HEADERS' columns for `events --follow`: every value a closed vocabulary can
    take (time, event, failure and priority class) fits from the first row; consumers as
    configured; model names up to MODEL_WIDTH."""
    events = [k.value for k in EventKind] + [f"FAILURE {f.value}" for f in FailureClass]
    widths = [
        len(_when(0.0)),
        max(map(len, events)),
        max(map(len, owners), default=0),
        MODEL_WIDTH,
        max(len(c.label) for c in PriorityClass),
        0,
    ]
    return Columns([max(w, len(h)) for w, h in zip(widths, EVENT_HEADERS, strict=True)])


def event_filters(args: argparse.Namespace) -> dict[str, str]:
    """The events query's filters; ValueError for a class that names none (the gate would
    match nothing, and say nothing about the typo)."""
    query = {}
    if args.priority:
        try:
            query["class"] = PriorityClass.parse(args.priority).label
        except ValueError as exc:
            raise ValueError(f"--class: {exc}") from None
    if args.consumer:
        query["consumer"] = args.consumer
    if args.failure:
        failure = args.failure.strip().upper()
        known = {f.value for f in FailureClass}
        if failure in ("ANY", "*"):
            failure = "*"
        elif failure not in known:
            raise ValueError(
                f"--failure: unknown failure class {args.failure!r} "
                f"(`any`, or one of {', '.join(sorted(known))})"
            )
        query["failure"] = failure
    return query


def render_envelopes(rows: list[dict[str, Any]]) -> str:
    if not rows:
        return "no envelope measured yet"
    return table(
        ("CONSUMER", "MODEL", "OPTIONS", "BYTES", "MEASURED", "RUNTIME"),
        [
            (
                r["consumer"],
                r["model"],
                r["options"] or "-",
                _size(r["bytes"]),
                _when(r["measured"]),
                r["runtime_version"] or "-",
            )
            for r in rows
        ],
    )


# -- running them -----------------------------------------------------------------------


def run(args: argparse.Namespace, out: TextIO | None = None) -> int:
    """`gpugate leases`, `gpugate events` or `gpugate envelopes`: the command line checked,
    then the configuration found."""
    stream = out or sys.stdout

    def emit(text: str) -> None:
        stream.write(text + "\n")
        stream.flush()

    async def leases(control: Control, session: aiohttp.ClientSession) -> None:
        status = await control.get(session, "/gate/v1/status")
        listed = await control.get(session, "/gate/v1/leases")
        rows = leases_rows(status, listed)
        queue = status.get("queue", [])
        if args.json:
            emit(json.dumps({"leases": rows, "queue": queue}, indent=2))
        else:
            emit(render_leases_and_queue(rows, queue))

    async def events(control: Control, session: aiohttp.ClientSession) -> None:
        query = {"recent": str(max(0, args.last)), **filters}
        if not args.follow:
            rows = await control.get(session, "/gate/v1/events", **query)
            if args.json:
                for row in rows:
                    emit(json.dumps(row))
            else:
                emit(table(EVENT_HEADERS, [event_row(r) for r in rows]) if rows else "no event")
            return
        columns = event_columns(control.owners)
        async for kind, data in control.follow(session, "/gate/v1/events", follow="1", **query):
            if kind == "open" and not args.json:
                emit(columns.line(EVENT_HEADERS))
            elif kind == "event":
                emit(json.dumps(data) if args.json else columns.line(event_row(data)))
            elif kind == "dropped" and not args.json:
                emit(f"({data['events']} events were dropped: this terminal read too slowly)")
        raise ControlFailure("the gate ended the stream (it stopped)", Exit.UNAVAILABLE)

    async def envelopes(control: Control, session: aiohttp.ClientSession) -> None:
        rows = (await control.get(session, "/gate/v1/envelopes"))["envelopes"]
        emit(json.dumps(rows, indent=2) if args.json else render_envelopes(rows))

    filters: dict[str, str] = {}
    if args.command == "events":
        try:
            filters = event_filters(args)
        except ValueError as exc:
            print(f"gpugate events: {exc}", file=sys.stderr)
            return Exit.USAGE
    bodies = {"leases": leases, "events": events, "envelopes": envelopes}
    return run_on_gate(args.command, find_config(args.config), bodies[args.command])
