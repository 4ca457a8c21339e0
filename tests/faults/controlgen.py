"""Seeded generator of hostile requests for the control listener, every route of it.

Lease requests are built from the API's own fields with values no reader should choke on:
nesting tens of thousands deep, integers of thousands of digits, `1e400`, NaN and
Infinity, sizes and durations past any card or clock, Unicode digits, lone surrogates,
keys twice, bytes that are not UTF-8; the other routes get hostile ids, names and query
strings. Requests carry a token with every scope (mostly), so bodies reach the handlers,
or one with the `lease` scope only, an identity's, or none. Bodies are framed as
tests.faults.fuzzgen frames them.
"""

from __future__ import annotations

import json
import random

from tests.faults.fuzzgen import FuzzRequest, Target, frame

FULL_TOKEN = "fuzz-control-token"
LEASE_TOKEN = "fuzz-lease-token"
IDENTITY_TOKEN = "fuzz-identity-token"
SETTINGS = f"""\
control_tokens:
  - {FULL_TOKEN}
  - {{token: {LEASE_TOKEN}, scopes: [lease]}}
max_lease_ttl: 5s
"""
"""The gate's `gate:` lines for the control fuzz: its tokens, and a maximum ttl short
enough that every lease the fuzz is granted lapses within seconds."""
IDENTITIES = f"""\
identities:
  - name: batch
    class: background
    tokens: [{IDENTITY_TOKEN}]
"""

AUTHORIZATIONS = [
    *[f"Authorization: Bearer {FULL_TOKEN}"] * 8,
    f"Authorization: Bearer {LEASE_TOKEN}",
    f"Authorization: Bearer {IDENTITY_TOKEN}",
    "Authorization: Bearer nope",
    "Authorization: Bearer \udcff\udcfe",
    "Authorization: Basic Zm9vOmJhcg==",
    None,
]  # fmt: skip


def _digits(rng: random.Random) -> str:
    return "9" * rng.choice([20, 400, 4300, 4301, 6000])


def _deep(rng: random.Random) -> str:
    depth = rng.choice([100, 1000, 5000, 30000])
    opener = rng.choice(["[", '{"a":'])
    closed = rng.random() < 0.5
    inner = opener * depth
    if closed:
        inner += "1" + ("]" if opener == "[" else "}") * depth
    return inner


SMALL_SECONDS = ['"1s"', '"2s"', "1", "1.5", '"500ms"', '"1s500ms"']
"""Durations a valid request may carry: short, so nothing waits long nor holds long."""
HOSTILE_SCALARS = [
    "NaN", "Infinity", "-Infinity", "1e400", "-1e400", "-0", "0", "-1", "1.5e308", "null",
    "true", "[]", "{}", '""', '"\\ud800"', '"\\u0000"', '"\u00b2"', '"\u0663s"', '"1e3"',
    '"inf"', '"nan"', '"-1s"', '"99999999999999d"', '"1h"', '"9999h"', "[1]", '{"s": 1}',
]  # fmt: skip
HOSTILE_SIZES = [
    '"1GiB"', '"512MiB"', "1073741824", '"0"', "0", "-1", "1.5", '"1.5GiB"', '"1e9"',
    '"64GiB"', '"1PiB"', '"2PiB"', '"\u0661GiB"', '"1 GiB"', '"GiB"', '"1XB"',
]  # fmt: skip
NAMES = [*['"ollama"', '"batch"'] * 4, '"nobody"', '""', '"\\ud800"', '"a\\u0000b"', "1", "null",
         '["ollama"]', '"' + "x" * 3000 + '"']  # fmt: skip


def _field_value(rng: random.Random, field: str) -> str:
    roll = rng.random()
    if roll < 0.04:
        return _digits(rng)
    if roll < 0.07:
        return _deep(rng)
    if roll < 0.1:
        return '"' + _digits(rng) + rng.choice(["", "GiB", "s", "d", "h"]) + '"'
    if roll < 0.25:
        return rng.choice(HOSTILE_SCALARS)
    if field == "bytes":
        return rng.choice(HOSTILE_SIZES)
    if field in ("ttl", "max_wait"):
        return rng.choice(SMALL_SECONDS)
    if field in ("consumer", "identity"):
        return rng.choice(NAMES)
    if field == "class":
        return rng.choice(['"background"', '"interactive"', '"production"', '"urgent"', "7"])
    if field == "gpu":
        return rng.choice(["0", "1", "-1", '"0"', "1e3", "true"])
    if field == "purpose":
        return rng.choice(['"hold"', '"start"', '"HOLD"', "1"])
    return rng.choice(HOSTILE_SCALARS)


def lease_body(rng: random.Random) -> bytes:
    """A lease request: mostly plausible, each field possibly hostile; the whole body now
    and then nested, cut short, not UTF-8 or not JSON at all."""
    fields = [rng.choice(["consumer", "consumer", "identity"]), "bytes"]
    fields += rng.sample(["class", "ttl", "gpu", "purpose", "colour"], rng.randint(0, 3))
    if rng.random() < 0.1:
        fields.append(rng.choice(fields))  # a key twice
    values = [(f, _field_value(rng, f)) for f in fields]
    # Whatever else it says, it waits no longer than a few seconds for room; a start
    # lease, whose ttl is otherwise its consumer's start_admission_timeout (120 s, not
    # bound by gate.max_lease_ttl), holds no longer either.
    values.append(("max_wait", rng.choice(SMALL_SECONDS)))
    if ("purpose", '"start"') in values and "ttl" not in fields:
        values.append(("ttl", rng.choice(SMALL_SECONDS)))
    pairs = [f"{json.dumps(f)}: {value}" for f, value in values]
    rng.shuffle(pairs)
    text = "{" + ", ".join(pairs) + "}"
    roll = rng.random()
    if roll < 0.05:
        text = _deep(rng)
    elif roll < 0.08:
        text = text[: rng.randint(0, len(text))]
    elif roll < 0.11:
        text = rng.choice(["", " ", "[]", "null", "1", '"x"', "{}{}", "\ufeff{}", "NaN"])
    data = text.encode("utf-8", "surrogatepass")
    if rng.random() < 0.03:
        data = rng.choice([b"\xff\xfe", b"\xef\xbb\xbf", b"\x1f\x8b\x08\x00"]) + data
    if rng.random() < 0.01:
        data += b" " * (64 * 1024)  # past the control API's body limit
    return data


IDS = ["1", "2", "3", "0", "-1", "1e3", "\u00b2", "\u0661", "x", "9" * 30, "9" * 5000, "%00",
       "%ff", "1%2f2", ""]  # fmt: skip
WORDS = ["ollama", "nobody", "gemma3:12b", "bge-m3", "llama3.2:3b", "%00", "%ff", "%2e%2e",
         "a" * 3000, ":", "x@sha256:zz", "GEMMA3:12B", "\u00e9"]  # fmt: skip
QUERY_VALUES = ["", "1", "0", "-1", "x", "\u00b2", "%ff", "%zz", "9" * 5000, "nan", "inf",
                "1e400", "interactive", "LEASE_TIMEOUT", "*", "explicit,job", "24h",
                "9" * 400 + "d"]  # fmt: skip


def _query(rng: random.Random, names: list[str]) -> str:
    chosen = rng.sample(names, rng.randint(0, min(3, len(names))))
    if not chosen:
        return ""
    return "?" + "&".join(f"{name}={rng.choice(QUERY_VALUES)}" for name in chosen)


def route(rng: random.Random) -> tuple[str, str, bool]:
    """(method, path with query, whether it takes a body) of some control route."""
    roll = rng.random()
    if roll < 0.45:
        return "POST", "/gate/v1/leases" + _query(rng, ["x"]) * (rng.random() < 0.1), True
    if roll < 0.55:
        lease = rng.choice(IDS)
        return rng.choice([("POST", f"/gate/v1/leases/{lease}/renew", False),
                           ("DELETE", f"/gate/v1/leases/{lease}", False)])  # fmt: skip
    if roll < 0.62:
        consumer, model = rng.choice(WORDS), rng.choice(WORDS)
        path = f"/gate/v1/residents/{consumer}/{model}/evict" + _query(rng, ["force", "options"])
        return "POST", path, False
    if roll < 0.68:
        action = rng.choice(["drain", "undrain", ""])
        path = f"/gate/v1/consumers/{rng.choice(WORDS)}" + (f"/{action}" if action else "")
        return ("POST" if action else "GET"), path, False
    if roll < 0.74:
        # Paused and resumed alike, so no pause outlives the run for long.
        action = rng.choice(["pause", "resume", "resume"])
        return "POST", f"/gate/v1/gpus/{rng.choice(IDS)}/{action}", False
    reads = [
        ("/gate/v1/events", ["recent", "class", "failure", "consumer"]),
        ("/gate/v1/events", ["follow", "recent", "class", "failure"]),
        ("/gate/v1/stream", ["class", "failure", "consumer"]),
        ("/gate/v1/history", ["gpu", "since", "step"]),
        ("/gate/v1/capacity", ["consumer", "model", "class"]),
        ("/gate/v1/leases", ["scope"]),
        ("/gate/v1/status", ["x"]),
        ("/gate/v1/health", []),
        ("/gate/v1/envelopes", []),
        ("/gate/v1/openapi.json", []),
        ("/metrics", []),
        ("/static/" + rng.choice(["app.js", "..%2fapp.py", "%00", "x.css"]), []),
        ("/gate/v1/" + rng.choice(["nothing", "", "leases/1/x"]), []),
    ]
    path, names = rng.choice(reads)
    method = rng.choice(["GET", "GET", "GET", "HEAD", "PUT", "POST", "DELETE", "OPTIONS"])
    return method, path + _query(rng, names), method in ("PUT", "POST")


def generate_control(rng: random.Random, host: str) -> FuzzRequest:
    """One hostile request for the control listener."""
    method, path, takes_body = route(rng)
    body = lease_body(rng) if takes_body else b""
    headers = [f"Host: {host}" if rng.random() < 0.95 else "Host: evil.example"]
    authorization = rng.choice(AUTHORIZATIONS)
    if authorization is not None:
        headers.append(authorization)
    if body and rng.random() < 0.8:
        headers.append(rng.choice(["Content-Type: application/json", "Content-Type: text/plain",
                                   "Content-Type: application/json; charset=latin-1",
                                   "Content-Type: multipart/form-data; boundary=x"]))  # fmt: skip
    if rng.random() < 0.03:
        headers.append("Content-Encoding: gzip")
    return frame(rng, Target.CONTROL, method, path, headers, body)
