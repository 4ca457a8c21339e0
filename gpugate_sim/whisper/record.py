"""The record of `/load` and `/inference` answers (HOST.yaml `whisper.record`), for a
fuzzer's oracle.

One JSON line per request those handlers took: when the handler started, the request's
`case` query parameter and the status answered (after cpp-httplib's error handler); a
/load line adds the model asked for and whether the server switched to it.
tests/faults/records.py reads it back.
"""

from __future__ import annotations

import enum

import attrs

from gpugate_sim.recordfile import RecordFile

ACTING = "gpugate_sim.whisper.acting"
"""The request key under which a handler leaves what it did, for the framing to record."""


class Route(enum.Enum):
    LOAD = "load"
    INFERENCE = "inference"


@attrs.frozen
class LoadRecord:
    t: float
    case: str
    status: int | None
    """None: no answer, the process exited (a model that does not fit, or a path that opens
    but is no model: another file, a directory)."""
    model: str | None
    """The `model` field's text; None without one."""
    loaded: bool


@attrs.frozen
class InferenceRecord:
    t: float
    case: str
    status: int


@attrs.define
class Acting:
    """What one /load or /inference handler did so far."""

    route: Route
    t: float
    case: str
    model: str | None = None
    loaded: bool = False

    def record(self, status: int | None) -> LoadRecord | InferenceRecord:
        if self.route is Route.LOAD:
            return LoadRecord(self.t, self.case, status, self.model, self.loaded)
        assert status is not None
        return InferenceRecord(self.t, self.case, status)


WhisperRecords = RecordFile
"""The record file of this runtime's lines."""
