"""Read-only views of the running gate: `gpugate status --watch`, `leases`, `events`,
`envelopes`. Tables for people, `--json` for scripts; an error is one line on stderr and
exit status 1 (2 for a bad configuration).

The gate is found as `gpugate lease` finds it: the control address in the configuration
($GPUGATE_CONFIG, ./consumers.yaml, /etc/gpugate/consumers.yaml, or --config), and a
token from $GPUGATE_TOKEN or the configuration when reads are not public.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime
import json
import sys
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path
from typing import Any, TextIO

import aiohttp

from gpugate.core.units import GiB, MiB

TIMEOUT = aiohttp.ClientTimeout(total=5.0, sock_connect=2.0)
WATCH_INTERVAL = 1.0
CLEAR = "\x1b[H\x1b[2J"


class ViewError(Exception):
    """Why a view could not be shown, in one line."""


def add_view_parsers(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """The `leases`, `events` and `envelopes` subcommands."""
    leases = sub.add_parser("leases", help="the leases in flight on the running gate")
    events = sub.add_parser("events", help="the gate's recent events, or follow them live")
    events.add_argument("--follow", "-f", action="store_true", help="go on printing new events")
    events.add_argument("--class", dest="priority", help="only requests of this priority class")
    events.add_argument("--consumer", help="only this consumer's events")
    events.add_argument("--failure", help="only failures of this class (`any`: every failure)")
    events.add_argument("--last", type=int, default=50, help="how many recent events (50)")
    envelopes = sub.add_parser("envelopes", help="measured envelopes: bytes, when, runtime")
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


class Control:
    """The running gate's control API, read-only."""

    def __init__(self, base: str, token: str | None) -> None:
        self.base = base
        self.headers = {"Authorization": f"Bearer {token}"} if token else {}

    @classmethod
    def from_config(cls, path: Path) -> Control:
        from gpugate.control_client import control_address

        base, token = control_address(path)
        return cls(base, token)

    async def get(self, session: aiohttp.ClientSession, path: str, **query: str) -> Any:
        try:
            async with session.get(self.base + path, params=query, headers=self.headers) as r:
                if r.status != 200:
                    raise ViewError(f"{path} answered {r.status}: {(await r.text())[:200]}")
                if r.content_type == "application/x-ndjson":
                    return [json.loads(line) for line in (await r.text()).splitlines() if line]
                return await r.json()
        except (aiohttp.ClientConnectionError, TimeoutError) as exc:
            raise ViewError(f"no gate answers at {self.base} ({exc.__class__.__name__})") from exc

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
                    raise ViewError(f"{path} answered {r.status}: {(await r.text())[:200]}")
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
        except (aiohttp.ClientConnectionError, TimeoutError) as exc:
            raise ViewError(f"no gate answers at {self.base} ({exc.__class__.__name__})") from exc


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


def _run(
    name: str, config_path: Path, body: Callable[[Control, aiohttp.ClientSession], Any]
) -> int:
    from gpugate.config.loader import ConfigError

    try:
        control = Control.from_config(config_path)
    except (ConfigError, OSError) as exc:
        print(f"gpugate {name}: {str(exc).splitlines()[0]}", file=sys.stderr)
        return 2

    async def main() -> int:
        async with aiohttp.ClientSession(timeout=TIMEOUT) as session:
            await body(control, session)
        return 0

    try:
        return asyncio.run(main())
    except ViewError as exc:
        print(f"gpugate {name}: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


def run_view(args: argparse.Namespace, config_path: Path, out: TextIO | None = None) -> int:
    """`gpugate leases`, `gpugate events` or `gpugate envelopes`."""
    stream = out or sys.stdout

    def emit(text: str) -> None:
        stream.write(text + "\n")
        stream.flush()

    async def leases(control: Control, session: aiohttp.ClientSession) -> None:
        status = await control.get(session, "/gate/v1/status")
        listed = await control.get(session, "/gate/v1/leases")
        rows = leases_rows(status, listed)
        emit(json.dumps(rows, indent=2) if args.json else render_leases(rows))

    async def events(control: Control, session: aiohttp.ClientSession) -> None:
        query = {"recent": str(max(0, args.last))}
        for key, value in (
            ("class", args.priority),
            ("consumer", args.consumer),
            ("failure", "*" if (args.failure or "").lower() == "any" else args.failure),
        ):
            if value:
                query[key] = value
        if not args.follow:
            rows = await control.get(session, "/gate/v1/events", **query)
            if args.json:
                for row in rows:
                    emit(json.dumps(row))
            else:
                emit(table(EVENT_HEADERS, [event_row(r) for r in rows]) if rows else "no event")
            return
        async for kind, data in control.follow(session, "/gate/v1/events", follow="1", **query):
            if kind == "open" and not args.json:
                emit("  ".join(EVENT_HEADERS))
            elif kind == "event":
                emit(json.dumps(data) if args.json else "  ".join(map(str, event_row(data))))
            elif kind == "dropped" and not args.json:
                emit(f"({data['events']} events were dropped: this terminal read too slowly)")
        raise ViewError("the gate ended the stream (it stopped)")

    async def envelopes(control: Control, session: aiohttp.ClientSession) -> None:
        rows = (await control.get(session, "/gate/v1/envelopes"))["envelopes"]
        emit(json.dumps(rows, indent=2) if args.json else render_envelopes(rows))

    bodies = {"leases": leases, "events": events, "envelopes": envelopes}
    return _run(args.command, config_path, bodies[args.command])


def run_watch(config_path: Path, *, as_json: bool, out: TextIO | None = None) -> int:
    """`gpugate status --watch`: the budget from the running gate, redrawn every second."""
    from gpugate.status import render_text

    stream = out or sys.stdout

    async def watch(control: Control, session: aiohttp.ClientSession) -> None:
        first = True
        while True:
            try:
                document = await control.get(session, "/gate/v1/status")
                text = json.dumps(document) if as_json else render_text(document)
            except ViewError as exc:
                if first:
                    raise
                text = f"gpugate status: {exc}; retrying"
            first = False
            stamp = datetime.datetime.now().strftime("%H:%M:%S")
            if as_json:
                stream.write(text + "\n")
            else:
                stream.write(f"{CLEAR}gpugate status  {stamp}  (Ctrl-C to stop)\n{text}\n")
            stream.flush()
            await asyncio.sleep(WATCH_INTERVAL)

    with contextlib.suppress(KeyboardInterrupt):
        return _run("status", config_path, watch)
    return 130
