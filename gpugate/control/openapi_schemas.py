"""The control API's OpenAPI parts: parameters, responses and the shapes of its answers."""

from __future__ import annotations

from typing import Any

BYTES = {"type": "integer", "description": "bytes"}
SECONDS = {"type": "number", "description": "seconds"}


def response(description: str, schema: dict[str, Any] | None = None) -> dict[str, Any]:
    return {
        "description": description,
        "content": {"application/json": {"schema": schema or {"type": "object"}}},
    }


def query_param(name: str, description: str, kind: str = "string") -> dict[str, Any]:
    return {
        "name": name,
        "in": "query",
        "required": False,
        "description": description,
        "schema": {"type": kind},
    }


def path_param(name: str, kind: str = "string") -> dict[str, Any]:
    return {"name": name, "in": "path", "required": True, "schema": {"type": kind}}


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
UNAUTHORIZED = response("no valid bearer token for this route", ERROR)
FORBIDDEN = response(
    "FORBIDDEN: a control token without the scope this route needs (the message names it; "
    'WWW-Authenticate says error="insufficient_scope")',
    ERROR,
)
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
KEY = {
    "type": "object",
    "properties": {
        "consumer": {"type": "string"},
        "model": {"type": "string"},
        "options": {"type": "string"},
    },
}
WAITING = {
    "type": "object",
    "properties": {
        "ticket": {"type": "integer"},
        "consumer": {"type": "string"},
        "model": {"type": "string"},
        "class": {"type": "string"},
        "gpu": {"type": "integer"},
        "position": {"type": "integer", "description": "in its GPU's queue; 0 is the head"},
        "bytes": BYTES,
        "waiting_seconds": SECONDS,
        "deadline_in_seconds": {
            **SECONDS,
            "description": "seconds until it fails LEASE_TIMEOUT if still waiting",
        },
        "reason": {
            "type": "string",
            "enum": [
                "paused",
                "sample",
                "same_model",
                "unload",
                "loading",
                "preemption",
                "head_of_line",
                "holder_grace",
                "holder_busy",
                "bytes",
                "turn",
            ],
            "description": "what it waits for: its GPU paused; a fresh NVML sample (an "
            "overrun growing, a stale sample); its model loading, or a ticket ahead that "
            "loads it (`behind`); unloads under way (`unloading`); another lease on the card "
            "not yet allocated (it sizes itself to free memory); jobs it preempted; the "
            "tickets ahead (`behind`), when it would fit now or what would free its memory "
            "(`holder`) goes to one of them first; a `holder` it may "
            "have once idle the equal-class grace (`hold: grace`) or at its idle ttl "
            "(`hold: keep_warm`), `until_seconds` from now; a holder serving requests; "
            "`short` bytes and no one holder; nothing any more (the next pass grants it)",
        },
        "line": {"type": "string", "description": "the reason in one line for a person"},
        "short": {
            **BYTES,
            "description": "bytes short after what is schedulable and what could be evicted "
            "for it now",
        },
        "holder": {**KEY, "type": ["object", "null"]},
        "hold": {"type": ["string", "null"], "enum": ["grace", "keep_warm", None]},
        "until_seconds": {**SECONDS, "type": ["number", "null"]},
        "behind": {"type": ["integer", "null"], "description": "the ticket it waits behind"},
        "unloading": {"type": "array", "items": KEY},
    },
    "required": [
        "ticket",
        "consumer",
        "model",
        "class",
        "gpu",
        "position",
        "waiting_seconds",
        "deadline_in_seconds",
        "reason",
        "line",
    ],
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
                    "queued_bytes": {
                        **BYTES,
                        "description": "what the waiting demands will take, each load once",
                    },
                    "queue": {
                        "type": "array",
                        "items": WAITING,
                        "description": "as /gate/v1/queue has them",
                    },
                    "residents": {"type": "array", "items": CAPACITY_RESIDENT},
                },
            },
        },
        "models": {"type": "array", "items": CAPACITY_MODEL},
    },
    "required": ["ok", "failed", "floor", "agent", "gpus", "models"],
}
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
