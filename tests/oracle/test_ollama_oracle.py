"""The Ollama oracle in front of the simulated Ollama: what it records for each kind of request."""

from __future__ import annotations

import base64
import http.client
import json
import os
import subprocess
import sys
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs
import pytest

from gpugate.core.units import GiB, MiB
from gpugate.sim.device import SimDevice, SimulatedGpuHost
from gpugate.sim.shim import STATE_ENV
from tests.oracle.oracle import ORACLE_BINARY, Record, read_records, start_oracle
from tests.sim.processes import LineReader, kill_quietly

pytestmark = pytest.mark.skipif(
    not ORACLE_BINARY.exists(),
    reason=f"{ORACLE_BINARY} is not built (tests/oracle/build.sh GO)",
)

HOST_YAML = """\
gpus:
  - name: NVIDIA GeForce RTX 4080
    total: 16GiB
ollama:
  listen: 127.0.0.1:0
  keep_alive: 10m
  num_parallel: 2
  models:
    - name: tiny
      size: 1GiB
      load_seconds: 10ms
    - name: embedder
      size: 512MiB
      embedding: true
      embedding_length: 8
"""


@attrs.frozen
class Oracle:
    url: str
    records: Path

    def send(
        self,
        method: str,
        path: str,
        case: str,
        body: bytes = b"",
        headers: dict[str, str] | None = None,
        query: dict[str, str] | None = None,
    ) -> tuple[int, Record]:
        """Send one request through the oracle; the status and the record of `case`."""
        parsed = urllib.parse.urlsplit(self.url)
        target = path + "?" + urllib.parse.urlencode({"case": case, **(query or {})})
        conn = http.client.HTTPConnection(parsed.hostname, parsed.port, timeout=30)
        try:
            conn.putrequest(method, target, skip_host="Host" in (headers or {}))
            for key, value in (headers or {}).items():
                conn.putheader(key, value)
            conn.putheader("Content-Length", str(len(body)))
            conn.endheaders(body)
            resp = conn.getresponse()
            resp.read()
        finally:
            conn.close()
        (record,) = [r for r in read_records(self.records) if r.case == case]
        return resp.status, record


@pytest.fixture(scope="module")
def oracle(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Oracle]:
    tmp = tmp_path_factory.mktemp("oracle")
    host = SimulatedGpuHost.create(
        tmp / "gpu", [SimDevice(0, 16 * GiB, 434 * MiB, "GPU-0", "NVIDIA GeForce RTX 4080")]
    )
    (tmp / "host.yaml").write_text(HOST_YAML)
    env = {**os.environ, STATE_ENV: str(host.state_path)}
    sim = subprocess.Popen(
        [sys.executable, "-m", "gpugate.sim.ollama", "serve",
         "--host-file", str(tmp / "host.yaml"), "--state-dir", str(host.directory)],
        stdout=subprocess.PIPE, text=True, env=env,
    )  # fmt: skip
    try:
        upstream = LineReader(sim.stdout).until("READY http://127.0.0.1:", timeout=30).split()[1]
        url, proc = start_oracle(upstream, tmp / "records.jsonl")
        try:
            yield Oracle(url, tmp / "records.jsonl")
        finally:
            proc.terminate()
            proc.wait(timeout=10)
    finally:
        kill_quietly(sim)


def body(**fields: Any) -> bytes:
    return json.dumps(fields).encode()


CHAT = [{"role": "user", "content": "hi"}]
# The routes the simulated upstream serves; on the others the oracle's verdict still holds.
SIM_ROUTES = {
    "/api/generate", "/api/chat", "/api/embed", "/api/embeddings",
    "/v1/chat/completions", "/v1/completions", "/v1/embeddings",
}  # fmt: skip
# Cases the simulated upstream answers unlike Ollama v0.24.0 (which trims the name, and
# decodes 10000 levels): the simulator fails them with 404 and 500 respectively.
SIM_DIVERGES = {"name-spaces", "depth-10000"}
DEEP = 9999  # with the enclosing object, 10000 levels: encoding/json's limit

# (case, path, body, could_load, model, reason prefix)
JSON_CASES: list[tuple[str, str, bytes, bool, str, str]] = [
    # Ordinary loads on every JSON route.
    ("generate", "/api/generate", body(model="tiny", prompt="hi"), True, "tiny:latest", ""),
    ("chat", "/api/chat", body(model="tiny", messages=CHAT), True, "tiny:latest", ""),
    ("embed", "/api/embed", body(model="embedder", input="x"), True, "embedder:latest", ""),
    (
        "embeddings",
        "/api/embeddings",
        body(model="embedder", prompt="x"),
        True,
        "embedder:latest",
        "",
    ),
    ("v1-chat", "/v1/chat/completions", body(model="tiny", messages=CHAT), True, "tiny:latest", ""),
    ("v1-completions", "/v1/completions", body(model="tiny", prompt="hi"), True, "tiny:latest", ""),
    (
        "v1-embeddings",
        "/v1/embeddings",
        body(model="embedder", input="x"),
        True,
        "embedder:latest",
        "",
    ),
    ("v1-responses", "/v1/responses", body(model="tiny", input="hi"), True, "tiny:latest", ""),
    (
        "v1-messages",
        "/v1/messages",
        body(model="tiny", max_tokens=8, messages=CHAT),
        True,
        "tiny:latest",
        "",
    ),
    # Decoding: missing body, trailing bytes, unknown fields, case-insensitive keys.
    ("empty-body", "/api/generate", b"", False, "", "decode: missing request body"),
    ("blank-body", "/api/chat", b" \n", False, "", "decode: missing request body"),
    (
        "trailing-bytes",
        "/api/generate",
        body(model="tiny", prompt="x") + b" }{garbage",
        True,
        "tiny:latest",
        "",
    ),
    (
        "unknown-field-wrong-type",
        "/api/generate",
        body(model="tiny", prompt="x", bogus={"a": [1, {"b": None}]}, stream_options=7),
        True,
        "tiny:latest",
        "",
    ),
    (
        "key-case-last-wins",
        "/api/generate",
        b'{"model":"nope","MODEL":"tiny","prompt":"x"}',
        True,
        "tiny:latest",
        "",
    ),
    # Type errors in known (nested) fields.
    (
        "content-number",
        "/api/chat",
        body(model="tiny", messages=[{"role": "user", "content": 5}]),
        False,
        "",
        "decode: ",
    ),
    (
        "images-not-base64",
        "/api/generate",
        body(model="tiny", prompt="x", images=["!!"]),
        False,
        "",
        "decode: ",
    ),
    (
        "arguments-string",
        "/api/chat",
        body(
            model="tiny",
            messages=[
                {
                    "role": "assistant",
                    "content": "",
                    "tool_calls": [{"function": {"name": "f", "arguments": "{}"}}],
                }
            ],
        ),
        False,
        "",
        "decode: ",
    ),
    (
        "arguments-null",
        "/api/chat",
        body(
            model="tiny",
            messages=[
                {
                    "role": "assistant",
                    "content": "",
                    "tool_calls": [{"function": {"name": "f", "arguments": None}}],
                }
            ],
        ),
        True,
        "tiny:latest",
        "",
    ),
    # Tool arguments and properties go through an ordered map with its own parser: a lone
    # surrogate escape or invalid UTF-8 in a key is refused there, though encoding/json takes it.
    (
        "arguments-lone-surrogate",
        "/api/chat",
        b'{"model":"tiny","messages":[{"role":"assistant","content":"","tool_calls":'
        b'[{"function":{"name":"f","arguments":{"\\ud800":1}}}]}]}',
        False,
        "",
        "decode: Encountered an invalid escape",
    ),
    (
        "arguments-key-not-utf8",
        "/api/chat",
        b'{"model":"tiny","messages":[{"role":"assistant","content":"","tool_calls":'
        b'[{"function":{"name":"f","arguments":{"\xff":1}}}]}]}',
        False,
        "",
        "decode: not a valid UTF-8 string",
    ),
    (
        "arguments-escaped-quote-key",
        "/api/chat",
        b'{"model":"tiny","messages":[{"role":"assistant","content":"","tool_calls":'
        b'[{"function":{"name":"f","arguments":{"a\\"b":1}}}]}]}',
        True,
        "tiny:latest",
        "",
    ),
    (
        "properties-not-object",
        "/api/chat",
        body(model="tiny", messages=CHAT, tools=[{"function": {"parameters": {"properties": 1}}}]),
        False,
        "",
        "decode: Value looks like object",
    ),
    (
        "think-bad-string",
        "/api/chat",
        body(model="tiny", messages=CHAT, think="very"),
        False,
        "",
        "decode: invalid think value",
    ),
    (
        "option-wrong-type",
        "/api/generate",
        body(model="tiny", prompt="x", options={"temperature": "hot"}),
        False,
        "tiny:latest",
        "options: ",
    ),
    (
        "top-logprobs",
        "/api/chat",
        body(model="tiny", messages=CHAT, top_logprobs=21),
        False,
        "tiny",
        "top_logprobs",
    ),
    # Nesting depth at and past encoding/json's limit (an unknown field still has to parse).
    (
        "depth-10000",
        "/api/generate",
        b'{"model":"tiny","prompt":"x","deep":' + b"[" * DEEP + b"]" * DEEP + b"}",
        True,
        "tiny:latest",
        "",
    ),
    (
        "depth-10001",
        "/api/generate",
        b'{"model":"tiny","prompt":"x","deep":' + b"[" * (DEEP + 1) + b"]" * (DEEP + 1) + b"}",
        False,
        "",
        # Go 1.26's v1 scanner words it as a syntax error at the bracket (scanner.go
        # pushParseState); the v2 decoder behind Go 1.27's encoding/json does not.
        "decode: invalid character '[' exceeded max depth",
    ),
    # Names: whitespace is trimmed, case folds to an installed model (not for /api/embeddings).
    ("name-spaces", "/api/generate", body(model="  tiny\t\n", prompt="x"), True, "tiny:latest", ""),
    ("name-case", "/api/chat", body(model="TINY:LATEST", messages=CHAT), True, "tiny:latest", ""),
    (
        "name-case-embeddings",
        "/api/embeddings",
        body(model="EMBEDDER", prompt="x"),
        False,
        "EMBEDDER:latest",
        "not found",
    ),
    ("name-empty", "/api/generate", body(model="", prompt="x"), False, "", "name: "),
    (
        "name-invalid",
        "/api/generate",
        body(model="a/b/c/d", prompt="x"),
        False,
        "a/b/c/d",
        "name: ",
    ),
    (
        "not-found",
        "/api/generate",
        body(model="nope", prompt="x"),
        False,
        "nope:latest",
        "not found",
    ),
    # keep_alive: parse errors refuse; zero with nothing to run is the unload shortcut.
    (
        "keep-alive-overflow",
        "/api/generate",
        body(model="tiny", prompt="x", keep_alive="9999999h"),
        False,
        "",
        "decode: time: invalid",
    ),
    (
        "keep-alive-bool",
        "/api/generate",
        body(model="tiny", prompt="x", keep_alive=True),
        False,
        "",
        "decode: Unsupported type",
    ),
    (
        "unload-generate",
        "/api/generate",
        body(model="tiny", keep_alive=0),
        False,
        "tiny:latest",
        "unload",
    ),
    (
        "unload-chat",
        "/api/chat",
        body(model="tiny", messages=[], keep_alive="0s"),
        False,
        "tiny:latest",
        "unload",
    ),
    (
        "zero-keep-alive-with-prompt",
        "/api/generate",
        body(model="tiny", prompt="x", keep_alive=0),
        True,
        "tiny:latest",
        "",
    ),
    # Cloud models run remotely.
    (
        "cloud-suffix",
        "/api/chat",
        body(model="tiny:cloud", messages=CHAT),
        False,
        "tiny:latest",
        "cloud",
    ),
    (
        "cloud-tag",
        "/api/generate",
        body(model="gpt-oss:20b-cloud", prompt="x"),
        False,
        "gpt-oss:20b",
        "cloud",
    ),
    (
        "cloud-v1",
        "/v1/chat/completions",
        body(model="tiny:cloud", messages=CHAT),
        False,
        "tiny:latest",
        "cloud",
    ),
    (
        "cloud-and-local",
        "/api/generate",
        body(model="tiny:cloud:local", prompt="x"),
        False,
        "tiny:cloud:local",
        "name: use either",
    ),
    # Capabilities and middleware refusals.
    (
        "embedder-chat",
        "/api/chat",
        body(model="embedder", messages=CHAT),
        False,
        "embedder:latest",
        "capability: completion",
    ),
    (
        "embed-input-type",
        "/api/embed",
        body(model="embedder", input=[1]),
        False,
        "embedder:latest",
        "input: ",
    ),
    (
        "v1-chat-no-messages",
        "/v1/chat/completions",
        body(model="tiny", messages=[]),
        False,
        "",
        "messages: ",
    ),
    (
        "v1-chat-bad-image",
        "/v1/chat/completions",
        body(
            model="tiny",
            messages=[
                {
                    "role": "user",
                    "content": [{"type": "image_url", "image_url": "https://example.com/x.png"}],
                }
            ],
        ),
        False,
        "",
        "convert: image URLs",
    ),
    (
        "v1-chat-tool-arguments",
        "/v1/chat/completions",
        body(
            model="tiny",
            messages=[
                {
                    "role": "assistant",
                    "content": "",
                    "tool_calls": [{"function": {"name": "f", "arguments": ""}}],
                }
            ],
        ),
        False,
        "",
        "convert: invalid tool call arguments",
    ),
    (
        "v1-embeddings-format",
        "/v1/embeddings",
        body(model="embedder", input="x", encoding_format="int8"),
        False,
        "",
        "encoding_format",
    ),
    (
        "v1-responses-effort",
        "/v1/responses",
        body(model="tiny", input="hi", reasoning={"effort": "extreme"}),
        False,
        "",
        "convert: invalid reasoning",
    ),
    (
        "v1-messages-no-max-tokens",
        "/v1/messages",
        body(model="tiny", messages=CHAT),
        False,
        "",
        "max_tokens",
    ),
    (
        "v1-messages-no-content",
        "/v1/messages",
        body(model="tiny", max_tokens=8, messages=[{"role": "user"}]),
        False,
        "",
        "decode: ",
    ),
]


@pytest.mark.parametrize(
    ("case", "path", "payload", "could_load", "model", "reason"),
    JSON_CASES,
    ids=[c[0] for c in JSON_CASES],
)
def test_json_requests_are_judged_as_ollama_reads_them(
    oracle: Oracle, case: str, path: str, payload: bytes, could_load: bool, model: str, reason: str
) -> None:
    status, record = oracle.send("POST", path, case, payload, {"Content-Type": "application/json"})
    assert (record.could_load, record.reason[: len(reason)]) == (could_load, reason), record
    if model:
        assert record.model == model, record
    assert (record.method, record.path) == ("POST", path)
    assert record.query.startswith(f"case={case}")
    if could_load and path in SIM_ROUTES and case not in SIM_DIVERGES:
        assert status == 200, record


def multipart(fields: dict[str, str], audio: bytes | None) -> tuple[bytes, str]:
    boundary = "oracle-test-boundary"
    parts = []
    for name, value in fields.items():
        parts.append(
            f'--{boundary}\r\nContent-Disposition: form-data; name="{name}"\r\n\r\n{value}\r\n'
        )
    head = "".join(parts).encode()
    if audio is not None:
        head += (
            (
                f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="a.wav"\r\n'
                "Content-Type: audio/wav\r\n\r\n"
            ).encode()
            + audio
            + b"\r\n"
        )
    return head + f"--{boundary}--\r\n".encode(), f"multipart/form-data; boundary={boundary}"


WAV = b"RIFF" + base64.b64decode("AAAAAA==")


@pytest.mark.parametrize(
    ("case", "fields", "query", "audio", "could_load", "model", "reason"),
    [
        ("tr-form", {"model": "tiny"}, {}, WAV, True, "tiny:latest", ""),
        ("tr-query", {}, {"model": "tiny"}, WAV, True, "tiny:latest", ""),
        ("tr-query-first", {"model": "nope"}, {"model": "tiny"}, WAV, True, "tiny:latest", ""),
        ("tr-form-unknown", {"model": "nope"}, {}, WAV, False, "nope:latest", "not found"),
        ("tr-no-model", {}, {}, WAV, False, "", "name: model is required"),
        ("tr-no-file", {"model": "tiny"}, {}, None, False, "tiny", "file: "),
        ("tr-empty-file", {"model": "tiny"}, {}, b"", False, "tiny", "file: empty"),
    ],
)
def test_transcriptions_read_the_model_from_query_then_form(
    oracle: Oracle,
    case: str,
    fields: dict[str, str],
    query: dict[str, str],
    audio: bytes | None,
    could_load: bool,
    model: str,
    reason: str,
) -> None:
    payload, content_type = multipart(fields, audio)
    _, record = oracle.send(
        "POST", "/v1/audio/transcriptions", case, payload, {"Content-Type": content_type}, query
    )
    assert (record.could_load, record.reason[: len(reason)]) == (could_load, reason), record
    assert record.model == model


def test_transcriptions_need_a_multipart_body(oracle: Oracle) -> None:
    _, record = oracle.send("POST", "/v1/audio/transcriptions", "tr-json", body(model="tiny"))
    assert not record.could_load and record.reason.startswith("multipart: ")


@pytest.mark.parametrize(
    ("case", "headers", "could_load", "reason"),
    [
        ("host-foreign", {"Host": "ollama.example.com"}, False, "host"),
        ("host-local-tld", {"Host": "box.internal:11434"}, True, ""),
        ("host-private-ip", {"Host": "10.1.2.3:11434"}, True, ""),
        ("origin-foreign", {"Origin": "https://evil.example"}, False, "cors"),
        ("origin-localhost", {"Origin": "http://localhost:3000"}, True, ""),
        ("origin-extension", {"Origin": "chrome-extension://abc"}, False, "cors"),
        ("origin-vscode", {"Origin": "vscode-webview://panel"}, True, ""),
    ],
)
def test_host_and_origin_checks(
    oracle: Oracle, case: str, headers: dict[str, str], could_load: bool, reason: str
) -> None:
    _, record = oracle.send("POST", "/api/generate", case, body(model="tiny", prompt="x"), headers)
    assert (record.could_load, record.reason) == (could_load, reason), record
    assert record.origin == headers.get("Origin", "")


@pytest.mark.parametrize(
    ("case", "method", "path", "reason"),
    [
        ("get-generate", "GET", "/api/generate", "method"),
        ("tags", "GET", "/api/tags", "route"),
        ("trailing-slash", "POST", "/api/generate/", "route"),
        ("double-slash", "POST", "/api//generate", "redirect: path not clean"),
    ],
)
def test_other_routes_and_methods_never_load(
    oracle: Oracle, case: str, method: str, path: str, reason: str
) -> None:
    _, record = oracle.send(method, path, case, body(model="tiny", prompt="x"))
    assert (record.could_load, record.reason) == (False, reason), record


def test_zstd_bodies_are_marked_undecided(oracle: Oracle) -> None:
    _, record = oracle.send(
        "POST", "/v1/responses", "zstd", b"\x28\xb5\x2f\xfd", {"Content-Encoding": "zstd"}
    )
    assert record.undecided and not record.could_load


def test_records_are_written_before_forwarding_and_stamped_at_arrival(oracle: Oracle) -> None:
    before = read_records(oracle.records)
    status, record = oracle.send("POST", "/api/generate", "stamp", body(model="tiny", prompt="x"))
    assert status == 200 and record.could_load
    assert all(r.t <= record.t for r in before)


# (case, path, body, could_load, keep_alive, runner, after_load, malformed)
READING_CASES: list[tuple[str, str, bytes, bool, int | None, dict, str, bool]] = [
    # Go leaves a string field as it was on null: the model is still "tiny".
    ("null-model", "/api/generate", b'{"model":"tiny","model":null,"prompt":"x"}',
     True, None, {}, "", False),
    # and sets a pointer to nil: no keep_alive.
    ("null-keep-alive", "/api/generate",
     b'{"model":"tiny","prompt":"x","keep_alive":"1m","KEEP_ALIVE":null}',
     True, None, {}, "", False),
    # Runner options as FromMap sets them: int64() of the number, null skipped, exact keys.
    ("runner-options", "/api/chat",
     b'{"model":"tiny","messages":[],"keep_alive":90,"options":{"num_ctx":2048.7,"NUM_GPU":1,'
     b'"use_mmap":false,"num_batch":null},"options":{"main_gpu":1e300}}',
     True, 90_000_000_000, {"num_ctx": 2048, "use_mmap": False, "main_gpu": -(2**63)}, "", False),
    # A dotless i does not fold to i: "optıons" is no field, its bad option unread.
    ("dotless-i", "/api/generate",
     '{"model":"tiny","prompt":"x","optıons":{"num_ctx":"x"}}'.encode(),
     True, None, {}, "", False),
    # The long s folds to s: "ſystem" is the system field, which raw refuses.
    ("long-s", "/api/generate", '{"model":"tiny","prompt":"x","ſystem":"s","raw":true}'.encode(),
     False, None, {}, "", False),
    ("kelvin", "/api/generate", '{"model":"tiny","prompt":"x","\u212aeep_alive":[]}'.encode(),
     False, None, {}, "", True),
    # Refused only once the model is loaded.
    ("format-yaml", "/api/generate", b'{"model":"tiny","prompt":"x","format":"yaml"}',
     True, None, {},
     'invalid format: "\\"yaml\\""; expected "json" or a valid JSON Schema object', False),
    ("format-chat", "/api/chat", b'{"model":"tiny","messages":[{"role":"user"}],"format":1}',
     True, None, {}, 'invalid format: "1"; expected "json" or a valid JSON Schema object',
     False),
    ("format-load-only", "/api/generate", b'{"model":"tiny","format":"yaml"}',
     True, None, {}, "", False),
    ("template-open", "/api/generate", b'{"model":"tiny","prompt":"x","template":"{{"}',
     True, None, {}, "template: :1: unclosed action", False),
    ("template-raw", "/api/generate",
     b'{"model":"tiny","prompt":"x","template":"","raw":true,"format":"json"}',
     True, None, {}, "", False),
]  # fmt: skip


@pytest.mark.parametrize(
    ("case", "path", "payload", "could_load", "keep_alive", "runner", "after_load", "malformed"),
    READING_CASES,
    ids=[c[0] for c in READING_CASES],
)
def test_the_reading_of_each_request_is_recorded(
    oracle: Oracle,
    case: str,
    path: str,
    payload: bytes,
    could_load: bool,
    keep_alive: int | None,
    runner: dict,
    after_load: str,
    malformed: bool,
) -> None:
    _, record = oracle.send("POST", path, case, payload, {"Content-Type": "application/json"})
    assert (record.could_load, record.malformed) == (could_load, malformed), record
    if could_load:
        assert record.model == "tiny:latest"
        assert (record.keep_alive, record.runner, record.after_load) == (
            keep_alive,
            runner,
            after_load,
        )
