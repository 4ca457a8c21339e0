"""The OpenAPI 3.1 document of `/gate/v1/` (served at `/gate/v1/openapi.json`).

Kept by hand beside the routes; `tests/control/test_openapi.py` checks it against the
app's router, so a route added without a description fails the suite.
"""

from __future__ import annotations

from typing import Any

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


CONSUMER_STATE = {
    "type": "object",
    "properties": {
        "consumer": {"type": "string"},
        "draining": {"type": "boolean"},
        "drained": {"type": "boolean", "description": "draining, and no lease of it is left"},
        "leases": {"type": "integer"},
    },
}
GPU_STATE = {
    "type": "object",
    "properties": {"gpu": {"type": "integer"}, "paused": {"type": "boolean"}},
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
                "401": UNAUTHORIZED,
                "404": _json("no such resident", ERROR),
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
                "responses": {"200": _json("its state", CONSUMER_STATE)},
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
        ),
        "/gate/v1/gpus/{index}/resume": action(
            "resume admission on a GPU", gpu, _json("resumed", GPU_STATE)
        ),
    }


def openapi_document() -> dict[str, Any]:
    """The document, built fresh (callers may change it)."""
    secured = [{"bearer": []}]
    paths: dict[str, Any] = {
        "/gate/v1/status": {
            "get": {
                "summary": "budget per GPU, residents, leases and the queue",
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
                    "400": _json("a bad parameter", ERROR),
                },
            }
        },
        "/gate/v1/stream": {
            "get": {
                "summary": "the dashboard's feed: `snapshot` on connect and on each change "
                "(at most 4 a second), `event` as each happens",
                "parameters": EVENT_FILTERS,
                "responses": {"200": SSE},
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
                                },
                                "required": ["bytes"],
                            }
                        }
                    },
                },
                "responses": {
                    "201": _json("granted", LEASE),
                    "400": _json("a bad request", ERROR),
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
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "gpugate control API",
            "version": "1",
            "description": "Read-only routes answer without a token on loopback "
            "(`gate.control_public`); every other method needs a bearer token.",
        },
        "components": {"securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}}},
        "paths": paths,
    }
