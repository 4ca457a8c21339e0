"""The OpenAPI 3.1 document of `/gate/v1/` (served at `/gate/v1/openapi.json`).

Kept by hand beside the routes; `tests/control/test_openapi.py` checks it against the
app's router, so a route added without a description fails the suite.
"""

from __future__ import annotations

from typing import Any

from gpugate.control.auth import ASK_LEASE, required_scopes

BYTES = {"type": "integer", "description": "bytes"}
SECONDS = {"type": "number", "description": "seconds"}


def _json(description: str, schema: dict[str, Any] | None = None) -> dict[str, Any]:
    return {
        "description": description,
        "content": {"application/json": {"schema": schema or {"type": "object"}}},
    }


def _query(name: str, description: str, kind: str = "string") -> dict[str, Any]:
    return {
        "name": name,
        "in": "query",
        "required": False,
        "description": description,
        "schema": {"type": kind},
    }


ERROR = {
    "type": "object",
    "properties": {
        "error": {
            "type": "object",
            "properties": {"class": {"type": "string"}, "message": {"type": "string"}},
            "required": ["class", "message"],
        }
    },
}
UNAUTHORIZED = _json("no valid bearer token for this route", ERROR)
FORBIDDEN = _json(
    "FORBIDDEN: a control token without the scope this route needs (the message names it; "
    'WWW-Authenticate says error="insufficient_scope")',
    ERROR,
)
SCOPES = "x-gpugate-scopes"
"""Per operation: the control token scopes of which one is needed (`read` only when reads
are not public)."""
LEASE = {
    "type": "object",
    "properties": {
        "id": {"type": "integer"},
        "consumer": {"type": "string"},
        "identity": {"type": "string"},
        "gpu": {"type": "integer"},
        "bytes": BYTES,
        "class": {"type": "string"},
        "ttl": SECONDS,
        "expires_in": SECONDS,
        "waited": SECONDS,
        "held_for": SECONDS,
        "scope": {"type": "string", "enum": ["request", "job", "process", "explicit"]},
        "purpose": {"type": "string", "enum": ["hold", "start"]},
    },
}
LISTED_LEASE = {
    "type": "object",
    "description": "an explicit lease as above; a request, job or process lease has null "
    "`ttl` and `expires_in`, and its `model` and `pending` bytes",
    "properties": {
        **LEASE["properties"],  # type: ignore[dict-item]
        "ttl": {**SECONDS, "type": ["number", "null"]},
        "expires_in": {**SECONDS, "type": ["number", "null"]},
        "model": {"type": "string"},
        "pending": BYTES,
    },
}
HEALTH_CHECK = {
    "type": "object",
    "properties": {
        "check": {"type": "string", "description": "`started`, `nvml`, or a consumer's signal"},
        "ok": {"type": "boolean"},
        "gpu": {"type": "integer"},
        "consumer": {"type": "string"},
        "signal": {
            "type": "string",
            "enum": ["listing", "health_route", "process", "unobserved"],
        },
        "fresh": {"type": ["boolean", "null"], "description": "null: no signal"},
        "stopped": {"type": "boolean", "description": "process: not running (starts on demand)"},
        "age_seconds": {**SECONDS, "type": ["number", "null"]},
        "limit_seconds": {**SECONDS, "type": ["number", "null"]},
        "error": {"type": "string"},
        "message": {"type": "string"},
    },
    "required": ["check", "ok"],
}
HEALTH = {
    "type": "object",
    "properties": {
        "ok": {"type": "boolean"},
        "failed": {"type": "array", "items": {"type": "string"}},
        "checks": {"type": "array", "items": HEALTH_CHECK},
    },
    "required": ["ok", "failed", "checks"],
}
AGENT_ANSWER = {
    "type": "object",
    "description": "what the agent-check responder (`gate.agent_check`) answers",
    "properties": {
        "line": {"type": "string", "description": "`up ready N%`, `drain 0%` or `maint 0%`"},
        "state": {"type": "string", "enum": ["up", "drain", "maint"]},
        "weight": {"type": "integer", "description": "percent of the server's weight"},
        "reason": {"type": "string"},
    },
    "required": ["line", "state", "weight", "reason"],
}
NULL_BYTES = {**BYTES, "type": ["integer", "null"]}
CAPACITY_MODEL = {
    "type": "object",
    "properties": {
        "consumer": {"type": "string"},
        "model": {"type": "string", "description": "as the gate keys it (`bge-m3:latest`)"},
        "gpu": {
            "type": "integer",
            "description": "the GPU the verdict is for (a split load: its worst part's)",
        },
        "gpus": {
            "type": "array",
            "items": {"type": "integer"},
            "description": "the GPUs a load would be leased on: one, or each a split spans",
        },
        "class": {"type": "string", "description": "the requests' class it was asked for"},
        "verdict": {
            "type": "string",
            "enum": ["resident", "fits", "after_eviction", "no_room", "unknown"],
            "description": "resident: served by a loaded (or loading) copy; fits: granted at "
            "once, nothing evicted; after_eviction: granted once idle residents its class may "
            "take are unloaded; no_room: not now (it would wait or fail, or `blocked`); "
            "unknown: no envelope known yet",
        },
        "plan": {
            "type": ["string", "null"],
            "enum": ["grant", "evict", "wait", "fail", None],
            "description": "the planner's decision (null: not asked)",
        },
        "needed": {**BYTES, "description": "bytes it would add (0: resident or unknown)"},
        "available": {
            **NULL_BYTES,
            "description": "bytes left for it: schedulable less what tickets ahead keep back",
        },
        "schedulable": NULL_BYTES,
        "envelope": NULL_BYTES,
        "envelope_source": {
            "type": ["string", "null"],
            "enum": ["configured", "measured", "estimate", None],
        },
        "victims": {
            "type": "array",
            "description": "after_eviction: the residents it would unload, in order",
            "items": {
                "type": "object",
                "properties": {
                    "consumer": {"type": "string"},
                    "model": {"type": "string"},
                    "options": {"type": "string"},
                },
            },
        },
        "freed": {**BYTES, "description": "after_eviction: bytes the victims give back"},
        "blocked": {
            "type": ["string", "null"],
            "enum": ["draining", "paused", "stale", "driver_error", "queue_full", None],
        },
        "reason": {"type": "string"},
        "agent": AGENT_ANSWER,
    },
    "required": ["consumer", "model", "gpu", "class", "verdict", "needed", "agent"],
}
CAPACITY_RESIDENT = {
    "type": "object",
    "properties": {
        "consumer": {"type": "string"},
        "model": {"type": "string"},
        "options": {"type": "string"},
        "bytes": BYTES,
        "state": {"type": "string", "enum": ["loading", "resident", "unloading", "suspect"]},
        "class": {"type": "string"},
        "policy": {"type": "string"},
        "in_flight": {"type": "integer"},
        "idle_seconds": SECONDS,
        "expires_in_seconds": {**SECONDS, "type": ["number", "null"]},
    },
}
CAPACITY = {
    "type": "object",
    "properties": {
        "ok": {"type": "boolean", "description": "what /gate/v1/health says"},
        "failed": {"type": "array", "items": {"type": "string"}},
        "floor": {**BYTES, "description": "below this schedulable on every GPU: drain"},
        "agent": AGENT_ANSWER,
        "gpus": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {
                    "gpu": {"type": "integer"},
                    "total": BYTES,
                    "schedulable": BYTES,
                    "paused": {"type": "boolean"},
                    "pressure": {"type": "boolean"},
                    "sample_age_seconds": {**SECONDS, "type": ["number", "null"]},
                    "queue_depth": {"type": "integer", "description": "tickets waiting"},
                    "residents": {"type": "array", "items": CAPACITY_RESIDENT},
                },
            },
        },
        "models": {"type": "array", "items": CAPACITY_MODEL},
    },
    "required": ["ok", "failed", "floor", "agent", "gpus", "models"],
}
LEASE_ID = {"name": "id", "in": "path", "required": True, "schema": {"type": "integer"}}
EVENT_FILTERS = [
    _query("consumer", "only events of this consumer"),
    _query("class", "only events of requests of this priority class"),
    _query("failure", "only failures of this class (`*`: every failure)"),
]
SSE = {
    "description": "server-sent events until the client leaves",
    "content": {"text/event-stream": {"schema": {"type": "string"}}},
}


def _path(name: str, kind: str = "string") -> dict[str, Any]:
    return {"name": name, "in": "path", "required": True, "schema": {"type": kind}}


WALL = {"type": ["number", "null"], "description": "wall-clock seconds; null: not known"}
WHO = {"type": ["string", "null"], "description": "who asked: an identity, or `token`"}
UNDO = {"type": ["string", "null"], "description": "the command that undoes it"}
CONSUMER_STATE = {
    "type": "object",
    "properties": {
        "consumer": {"type": "string"},
        "gpu": {"type": ["integer", "null"], "description": "its first GPU"},
        "gpus": {
            "type": ["array", "null"],
            "items": {"type": "integer"},
            "description": "every GPU it may use (`gpus:`; its one `gpu` otherwise)",
        },
        "draining": {"type": "boolean"},
        "drained": {"type": "boolean", "description": "draining, and no lease of it is left"},
        "leases": {"type": "integer"},
        "draining_since": WALL,
        "draining_seconds": {**SECONDS, "type": ["number", "null"]},
        "draining_by": WHO,
        "undo": UNDO,
        "lifecycle": {
            "type": ["object", "null"],
            "description": "a runtime whose memory is its process's: its lifecycle; "
            "null for a runtime that loads and unloads models itself",
            "properties": {
                "state": {"enum": ["stopped", "starting", "up", "asleep", "stopping"]},
                "since": WALL,
                "seconds": SECONDS,
                "failures": {
                    "type": "integer",
                    "description": "failed starts or crashes in a row (its start backoff)",
                },
            },
        },
    },
}
GPU_STATE = {
    "type": "object",
    "properties": {
        "gpu": {"type": "integer"},
        "paused": {"type": "boolean"},
        "paused_since": WALL,
        "paused_seconds": {**SECONDS, "type": ["number", "null"]},
        "paused_by": WHO,
        "undo": UNDO,
    },
}


def _operator_paths(secured: list[dict[str, list[str]]]) -> dict[str, Any]:
    """Operator actions (gpugate.control.operator): each is an event naming who asked."""
    consumer, gpu = [_path("name")], [_path("index", "integer")]

    def action(summary: str, params: list[Any], ok: dict[str, Any], **more: Any) -> Any:
        responses = {"401": UNAUTHORIZED, "404": _json("no such consumer or GPU", ERROR)}
        responses.update(more)
        return {
            "post": {
                "summary": summary,
                "security": secured,
                "parameters": params,
                "responses": {"200": ok, **responses},
            }
        }

    evict = {
        "post": {
            "summary": "unload an idle resident (eviction_started now, eviction_done follows)",
            "security": secured,
            "parameters": [
                _path("consumer"),
                _path("model"),
                _query("force", "1: evict an always_warm resident too"),
                _query("options", "the resident's runner options, when several match"),
            ],
            "responses": {
                "202": _json("the unload started", {"type": "object"}),
                "200": _json(
                    "a model the consumer knows that is not loaded: nothing to unload "
                    '(`"loaded": false`)',
                    {"type": "object"},
                ),
                "401": UNAUTHORIZED,
                "404": _json("no such model of the consumer", ERROR),
                "409": _json(
                    "EVICTION_NOT_ALLOWED (always_warm without force) or RESIDENCY_CONFLICT "
                    "(in flight, or not resident)",
                    ERROR,
                ),
            },
        }
    }
    return {
        "/gate/v1/residents/{consumer}/{model}/evict": evict,
        "/gate/v1/consumers/{name}": {
            "get": {
                "summary": "a consumer's operator state: draining, drained",
                "parameters": consumer,
                "responses": {
                    "200": _json("its state", CONSUMER_STATE),
                    "404": _json("no such consumer", ERROR),
                },
            }
        },
        "/gate/v1/consumers/{name}/drain": action(
            "admit nothing new for the consumer (503 RESIDENCY_CONFLICT); in-flight work ends",
            consumer,
            _json("draining", CONSUMER_STATE),
        ),
        "/gate/v1/consumers/{name}/undrain": action(
            "admit the consumer's demands again", consumer, _json("admitting", CONSUMER_STATE)
        ),
        "/gate/v1/gpus/{index}/pause": action(
            "pause admission on a GPU: new demands wait in its queue",
            gpu,
            _json("paused", GPU_STATE),
            **{"400": _json("the index is not a whole number", ERROR)},
        ),
        "/gate/v1/gpus/{index}/resume": action(
            "resume admission on a GPU",
            gpu,
            _json("resumed", GPU_STATE),
            **{"400": _json("the index is not a whole number", ERROR)},
        ),
    }


def _scoped(paths: dict[str, Any]) -> None:
    """Each operation's scopes from gpugate.control.auth's table, and the 403 of a token
    without them on every operation that needs a token."""
    for path, item in paths.items():
        for method, operation in item.items():
            scopes = [scope.value for scope in required_scopes(method.upper(), path)]
            operation[SCOPES] = scopes
            if "security" not in operation:
                continue
            operation["security"] = [{"bearer": [scope]} for scope in scopes]
            operation["responses"]["403"] = FORBIDDEN
            if (method.upper(), path) == ASK_LEASE:
                operation["description"] = (
                    "`lease` for an explicit lease; `admit` for a start lease "
                    '(`"purpose": "start"`)'
                )


def openapi_document() -> dict[str, Any]:
    """The document, built fresh (callers may change it)."""
    secured = [{"bearer": []}]
    paths: dict[str, Any] = {
        "/gate/v1/status": {
            "get": {
                "summary": "budget per GPU (paused or not), residents, leases, the queue "
                "and each consumer's drain",
                "responses": {"200": _json("the gate's books, in bytes and seconds")},
            }
        },
        "/gate/v1/health": {
            "get": {
                "summary": "whether samples and each consumer's health signal are fresh",
                "responses": {
                    "200": _json("every check passed", HEALTH),
                    "503": _json("a check failed (`failed` names it)", HEALTH),
                },
            }
        },
        "/gate/v1/capacity": {
            "get": {
                "summary": "capacity for routers: per GPU schedulable bytes, residents and "
                "queue depth; per model whether it is resident, fits, fits after an eviction, "
                "has no room now, or is unknown; the agent-check answer for each",
                "description": "The same numbers, one line at a time, on `gate.agent_check` "
                "(HAProxy's agent-check, TCP): per connection one request line (HAProxy's "
                "`agent-send`: empty for the host, or `MODEL` with optional `consumer=NAME` and "
                "`class=CLASS`) is answered with one line, `up ready N%`, `drain 0%` or "
                "`maint 0%`: each `agent.line` here is what it answers.",
                "parameters": [
                    _query("consumer", "only this fronted consumer's models"),
                    _query("model", "only this model (as a client names it)"),
                    _query("class", "ask as a request of this priority class would"),
                ],
                "responses": {
                    "200": _json("the numbers, in bytes and seconds", CAPACITY),
                    "400": _json("an unknown consumer or class, or an empty model", ERROR),
                },
            }
        },
        "/gate/v1/events": {
            "get": {
                "summary": "the recent events; with follow=1 a live stream",
                "parameters": [
                    _query("follow", "1: server-sent events (`event: event`) as they happen"),
                    _query(
                        "recent",
                        "at most this many recent events (with follow: sent first)",
                        "integer",
                    ),
                    *EVENT_FILTERS,
                ],
                "responses": {
                    "200": {
                        "description": "NDJSON, one event a line; with follow=1, SSE",
                        "content": {
                            "application/x-ndjson": {"schema": {"type": "string"}},
                            "text/event-stream": {"schema": {"type": "string"}},
                        },
                    },
                    "400": _json(
                        "a bad parameter: an unknown class or failure class, a `recent` that "
                        "is not a whole number",
                        ERROR,
                    ),
                },
            }
        },
        "/gate/v1/stream": {
            "get": {
                "summary": "the dashboard's feed: `snapshot` on connect and on each change "
                "(at most 4 a second), `event` as each happens",
                "parameters": EVENT_FILTERS,
                "responses": {"200": SSE, "400": _json("an unknown class or failure class", ERROR)},
            }
        },
        "/gate/v1/history": {
            "get": {
                "summary": "minute snapshots per GPU, downsampled to `step`",
                "parameters": [
                    _query("gpu", "NVML index (default: every GPU)", "integer"),
                    _query("since", "wall-clock seconds, or a duration back from now (24h)"),
                    _query("step", "one point per step (a duration, default 60s)"),
                ],
                "responses": {
                    "200": _json("`points`, oldest first per GPU"),
                    "400": _json("a bad parameter", ERROR),
                },
            }
        },
        "/gate/v1/envelopes": {
            "get": {
                "summary": "measured envelopes: bytes, when, under which runtime version",
                "responses": {"200": _json("`envelopes`")},
            }
        },
        "/gate/v1/openapi.json": {
            "get": {"summary": "this document", "responses": {"200": _json("OpenAPI 3.1")}}
        },
        "/gate/v1/leases": {
            "get": {
                "summary": "every lease held now, with its scope",
                "parameters": [
                    _query("scope", "only these scopes, comma-separated (`explicit`: as before)")
                ],
                "responses": {
                    "200": _json(
                        "`leases`, by id",
                        {
                            "type": "object",
                            "properties": {"leases": {"type": "array", "items": LISTED_LEASE}},
                        },
                    ),
                    "400": _json("an unknown scope", ERROR),
                },
            },
            "post": {
                "summary": "ask for an explicit lease; answers once granted or failed",
                "security": secured,
                "requestBody": {
                    "required": True,
                    "content": {
                        "application/json": {
                            "schema": {
                                "type": "object",
                                "properties": {
                                    "consumer": {"type": "string"},
                                    "identity": {"type": "string"},
                                    "bytes": {"type": ["integer", "string"]},
                                    "class": {"type": "string"},
                                    "ttl": {"type": ["number", "string"]},
                                    "max_wait": {"type": ["number", "string"]},
                                    "gpu": {"type": "integer"},
                                    "purpose": {
                                        "type": "string",
                                        "enum": ["hold", "start"],
                                        "description": "`start`: a consumer's start lease "
                                        "(`gpugate admit`; the `admit` scope); `hold` "
                                        "(default): the `lease` scope",
                                    },
                                },
                                "required": ["bytes"],
                            }
                        }
                    },
                },
                "responses": {
                    "201": _json("granted", LEASE),
                    "400": _json(
                        "BAD_REQUEST: a body that is not a lease request: not JSON in UTF-8 (a "
                        "Content-Encoding is not undone), NaN or Infinity, a number past a "
                        "double's range, nesting deeper than a request has, a key twice in one "
                        "object, an unknown field or name, a size or duration that does not "
                        "parse, a `ttl` under 1s or past `gate.max_lease_ttl`",
                        ERROR,
                    ),
                    "413": _json("PAYLOAD_TOO_LARGE: a body past 64 KiB", ERROR),
                    "401": UNAUTHORIZED,
                    "503": _json("no lease: the failure class in X-GPUGate-Failure", ERROR),
                },
            },
        },
        "/gate/v1/leases/{id}/renew": {
            "post": {
                "summary": "move an explicit lease's expiry to now + ttl",
                "security": secured,
                "parameters": [LEASE_ID],
                "responses": {
                    "200": _json("renewed", LEASE),
                    "401": UNAUTHORIZED,
                    "409": _json("LEASE_CONFLICT: not held", ERROR),
                },
            }
        },
        "/gate/v1/leases/{id}": {
            "delete": {
                "summary": "release an explicit lease",
                "security": secured,
                "parameters": [LEASE_ID],
                "responses": {
                    "200": _json("released", LEASE),
                    "401": UNAUTHORIZED,
                    "409": _json("LEASE_CONFLICT: not held", ERROR),
                },
            }
        },
    }
    paths.update(_operator_paths(secured))
    _scoped(paths)
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "gpugate control API",
            "version": "1",
            "description": "Read-only routes answer without a token on loopback "
            "(`gate.control_public`); every other method needs a bearer token. A control "
            "token may carry scopes (`gate.control_tokens`): each operation names the one it "
            f"needs in `{SCOPES}` and in its security requirement (`read` for every GET when "
            "reads are not public, `lease`, `admit` for a start lease, `operate`); a token "
            "without it is answered 403 FORBIDDEN, an unknown token 401. Every refusal is "
            '`{"error": {"class", "message"}}`, on every route: 404 NOT_FOUND for a path no '
            "route serves, 405 METHOD_NOT_ALLOWED (with `Allow`) for a method it does not take, "
            "413 PAYLOAD_TOO_LARGE for a body past 64 KiB.",
        },
        "components": {"securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}}},
        "paths": paths,
    }
