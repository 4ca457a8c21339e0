"""The control API's OpenAPI path items by route family: reads, leases, operator actions."""

from __future__ import annotations

from typing import Any

from gpugate.control.openapi_schemas import (
    CAPACITY,
    CONSUMER_STATE,
    ERROR,
    GPU_STATE,
    HEALTH,
    LEASE,
    LISTED_LEASE,
    UNAUTHORIZED,
    WAITING,
    path_param,
    query_param,
    response,
)

LEASE_ID = {"name": "id", "in": "path", "required": True, "schema": {"type": "integer"}}
EVENT_FILTERS = [
    query_param("consumer", "only events of this consumer"),
    query_param("class", "only events of requests of this priority class"),
    query_param("failure", "only failures of this class (`*`: every failure)"),
]
SSE = {
    "description": "server-sent events until the client leaves",
    "content": {"text/event-stream": {"schema": {"type": "string"}}},
}


def read_paths() -> dict[str, Any]:
    """The gate's books: status, health, capacity, the queue, events, history, envelopes and
    this document; each a GET."""
    return {
        "/gate/v1/status": {
            "get": {
                "summary": "budget per GPU (paused or not), residents, leases, the queue "
                "and each consumer's drain",
                "responses": {"200": response("the gate's books, in bytes and seconds")},
            }
        },
        "/gate/v1/health": {
            "get": {
                "summary": "whether samples and each consumer's health signal are fresh",
                "responses": {
                    "200": response("every check passed", HEALTH),
                    "503": response("a check failed (`failed` names it)", HEALTH),
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
                    query_param("consumer", "only this fronted consumer's models"),
                    query_param("model", "only this model (as a client names it)"),
                    query_param("class", "ask as a request of this priority class would"),
                ],
                "responses": {
                    "200": response("the numbers, in bytes and seconds", CAPACITY),
                    "400": response("an unknown consumer or class, or an empty model", ERROR),
                },
            }
        },
        "/gate/v1/queue": {
            "get": {
                "summary": "every waiting demand: consumer, model, class, GPU, position, wait "
                "so far, what it waits for (a reason and one line) and its deadline",
                "description": "The same rows as the status document's `queue`, the capacity "
                "API's per GPU `queue` and `gpugate leases`.",
                "parameters": [
                    query_param("gpu", "only this GPU's queue", "integer"),
                    query_param("consumer", "only this fronted consumer's demands"),
                ],
                "responses": {
                    "200": response(
                        "the queue, each GPU's in its order",
                        {
                            "type": "object",
                            "properties": {"queue": {"type": "array", "items": WAITING}},
                            "required": ["queue"],
                        },
                    ),
                    "400": response("an unknown GPU or consumer", ERROR),
                },
            }
        },
        "/gate/v1/events": {
            "get": {
                "summary": "the recent events; with follow=1 a live stream",
                "parameters": [
                    query_param("follow", "1: server-sent events (`event: event`) as they happen"),
                    query_param(
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
                    "400": response(
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
                "responses": {
                    "200": SSE,
                    "400": response("an unknown class or failure class", ERROR),
                },
            }
        },
        "/gate/v1/history": {
            "get": {
                "summary": "minute snapshots per GPU, downsampled to `step`",
                "parameters": [
                    query_param("gpu", "NVML index (default: every GPU)", "integer"),
                    query_param("since", "wall-clock seconds, or a duration back from now (24h)"),
                    query_param("step", "one point per step (a duration, default 60s)"),
                ],
                "responses": {
                    "200": response("`points`, oldest first per GPU"),
                    "400": response("a bad parameter", ERROR),
                },
            }
        },
        "/gate/v1/envelopes": {
            "get": {
                "summary": "measured envelopes: bytes, when, under which runtime version",
                "responses": {"200": response("`envelopes`")},
            }
        },
        "/gate/v1/openapi.json": {
            "get": {"summary": "this document", "responses": {"200": response("OpenAPI 3.1")}}
        },
    }


def lease_paths(secured: list[dict[str, list[str]]]) -> dict[str, Any]:
    """Explicit leases (gpugate.control.leases): listed, asked for, renewed, released."""
    return {
        "/gate/v1/leases": {
            "get": {
                "summary": "every lease held now, with its scope",
                "parameters": [
                    query_param(
                        "scope", "only these scopes, comma-separated (`explicit`: as before)"
                    )
                ],
                "responses": {
                    "200": response(
                        "`leases`, by id",
                        {
                            "type": "object",
                            "properties": {"leases": {"type": "array", "items": LISTED_LEASE}},
                        },
                    ),
                    "400": response("an unknown scope", ERROR),
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
                    "201": response("granted", LEASE),
                    "400": response(
                        "BAD_REQUEST: a body that is not a lease request: not JSON in UTF-8 (a "
                        "Content-Encoding is not undone), NaN or Infinity, a number past a "
                        "double's range, nesting deeper than a request has, a key twice in one "
                        "object, an unknown field or name, a size or duration that does not "
                        "parse, a `ttl` under 1s or past `gate.max_lease_ttl`",
                        ERROR,
                    ),
                    "413": response("PAYLOAD_TOO_LARGE: a body past 64 KiB", ERROR),
                    "401": UNAUTHORIZED,
                    "503": response("no lease: the failure class in X-GPUGate-Failure", ERROR),
                },
            },
        },
        "/gate/v1/leases/{id}/renew": {
            "post": {
                "summary": "move an explicit lease's expiry to now + ttl",
                "security": secured,
                "parameters": [LEASE_ID],
                "responses": {
                    "200": response("renewed", LEASE),
                    "401": UNAUTHORIZED,
                    "409": response("LEASE_CONFLICT: not held", ERROR),
                },
            }
        },
        "/gate/v1/leases/{id}": {
            "delete": {
                "summary": "release an explicit lease",
                "security": secured,
                "parameters": [LEASE_ID],
                "responses": {
                    "200": response("released", LEASE),
                    "401": UNAUTHORIZED,
                    "409": response("LEASE_CONFLICT: not held", ERROR),
                },
            }
        },
    }


def operator_paths(secured: list[dict[str, list[str]]]) -> dict[str, Any]:
    """Operator actions (gpugate.control.operator): each is an event naming who asked."""
    consumer, gpu = [path_param("name")], [path_param("index", "integer")]

    def action(summary: str, params: list[Any], ok: dict[str, Any], **more: Any) -> Any:
        responses = {"401": UNAUTHORIZED, "404": response("no such consumer or GPU", ERROR)}
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
                path_param("consumer"),
                path_param("model"),
                query_param("force", "1: evict an always_warm resident too"),
                query_param("options", "the resident's runner options, when several match"),
            ],
            "responses": {
                "202": response("the unload started", {"type": "object"}),
                "200": response(
                    "a model the consumer knows that is not loaded: nothing to unload "
                    '(`"loaded": false`)',
                    {"type": "object"},
                ),
                "401": UNAUTHORIZED,
                "404": response("no such model of the consumer", ERROR),
                "409": response(
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
                    "200": response("its state", CONSUMER_STATE),
                    "404": response("no such consumer", ERROR),
                },
            }
        },
        "/gate/v1/consumers/{name}/drain": action(
            "admit nothing new for the consumer (503 RESIDENCY_CONFLICT); in-flight work ends",
            consumer,
            response("draining", CONSUMER_STATE),
        ),
        "/gate/v1/consumers/{name}/undrain": action(
            "admit the consumer's demands again", consumer, response("admitting", CONSUMER_STATE)
        ),
        "/gate/v1/gpus/{index}/pause": action(
            "pause admission on a GPU: new demands wait in its queue",
            gpu,
            response("paused", GPU_STATE),
            **{"400": response("the index is not a whole number", ERROR)},
        ),
        "/gate/v1/gpus/{index}/resume": action(
            "resume admission on a GPU",
            gpu,
            response("resumed", GPU_STATE),
            **{"400": response("the index is not a whole number", ERROR)},
        ),
    }
