"""The simulated Ollama accepts and refuses request bodies where Ollama v0.24.0 does."""

from __future__ import annotations

import json

import aiohttp
import pytest

from gpugate.sim.ollama.names import ModelRef, go_trim_space
from gpugate.sim.ollama.server import SimOllama
from tests.sim.test_sim_ollama import make_sim, sim  # noqa: F401  (fixtures)

MODEL = "llama3.2"


async def post(sim: SimOllama, path: str, body: bytes, **kwargs: object) -> tuple[int, object]:  # noqa: F811
    async with (
        aiohttp.ClientSession() as session,
        session.post(sim.url + path, data=body, **kwargs) as resp,
    ):
        return resp.status, await resp.json(content_type=None)


def loads(sim: SimOllama) -> int:  # noqa: F811
    return sim.state().counters.loads


@pytest.mark.parametrize("space", [" ", "\t", "\n", "\x85", "\xa0", "\u3000"])
async def test_names_are_trimmed_with_gos_space_set_and_load(sim: SimOllama, space: str) -> None:  # noqa: F811
    body = json.dumps({"model": space + MODEL + space, "prompt": "hi", "stream": False}).encode()
    status, answer = await post(sim, "/api/generate", body)
    assert status == 200, answer
    assert sim.state().runner("llama3.2:latest") is not None


async def test_a_separator_python_would_strip_is_not_space(sim: SimOllama) -> None:  # noqa: F811
    assert go_trim_space("\x1cm") == "\x1cm"
    status, _ = await post(sim, "/api/generate", b'{"model":"\\u001cllama3.2","prompt":"x"}')
    assert status == 404 and loads(sim) == 0


def test_local_and_cloud_suffixes() -> None:
    assert ModelRef.parse(" m:local ") == ModelRef("m", "local")
    assert ModelRef.parse("m:7b-cloud") == ModelRef("m:7b", "cloud")
    assert ModelRef.parse("m:local:cloud") is None
    assert ModelRef.parse(" \t") is None


@pytest.mark.parametrize(
    ("keep_alive", "message"),
    [
        (b'"2562048h"', 'time: invalid duration "2562048h"'),
        (b'"9999999h"', 'time: invalid duration "9999999h"'),
        (
            b"1e400",
            "json: cannot unmarshal number 1e400 into Go struct field "
            "GenerateRequest.keep_alive of type float64",
        ),
    ],
)
async def test_keep_alive_beyond_gos_largest_duration_is_400(
    sim: SimOllama,  # noqa: F811
    keep_alive: bytes,
    message: str,
) -> None:
    body = b'{"model":"llama3.2","prompt":"x","keep_alive":' + keep_alive + b"}"
    assert await post(sim, "/api/generate", body) == (400, {"error": message})
    assert loads(sim) == 0


async def test_the_largest_duration_loads(sim: SimOllama) -> None:  # noqa: F811
    body = b'{"model":"llama3.2","prompt":"x","keep_alive":"2562047h","stream":false}'
    status, _ = await post(sim, "/api/generate", body)
    assert status == 200 and loads(sim) == 1


@pytest.mark.parametrize(
    ("path", "body", "message"),
    [
        (
            "/api/chat",
            b'{"model":"llama3.2","messages":[{"role":1}]}',
            "json: cannot unmarshal number into Go struct field ChatRequest.messages.role "
            "of type string",
        ),
        (
            "/api/chat",
            b'{"model":"llama3.2","messages":[{"tool_calls":[{"function":{"name":true}}]}]}',
            "json: cannot unmarshal bool into Go struct field "
            "ChatRequest.messages.tool_calls.function.name of type string",
        ),
        (
            "/api/chat",
            b'{"model":"llama3.2","messages":["hi"]}',
            "json: cannot unmarshal string into Go struct field ChatRequest.messages "
            "of type api.Alias",
        ),
        (
            "/api/chat",
            b'{"model":"llama3.2","messages":[{"images":[1]}]}',
            "json: cannot unmarshal number into Go struct field ChatRequest.messages.images "
            "of type api.ImageData",
        ),
        (
            "/api/generate",
            b'{"model":"llama3.2","context":"x"}',
            "json: cannot unmarshal string into Go struct field GenerateRequest.context "
            "of type []int",
        ),
    ],
)
async def test_type_errors_in_nested_fields_are_gos(
    sim: SimOllama,  # noqa: F811
    path: str,
    body: bytes,
    message: str,
) -> None:
    assert await post(sim, path, body) == (400, {"error": message})
    assert loads(sim) == 0


async def test_openai_nested_type_errors_name_the_innermost_struct(
    sim: SimOllama,  # noqa: F811
) -> None:
    body = (
        b'{"model":"llama3.2",'
        b'"messages":[{"role":"user","content":"x","tool_calls":[{"index":"1"}]}]}'
    )
    status, answer = await post(sim, "/v1/chat/completions", body)
    assert status == 400
    assert answer["error"]["message"] == (
        "json: cannot unmarshal string into Go struct field ToolCall.messages.tool_calls.index "
        "of type int"
    )


# The body's own object is the first of Go's 10000 levels.
@pytest.mark.parametrize(("depth", "status"), [(9999, 200), (10000, 400)])
async def test_nesting_depth_is_gos(sim: SimOllama, depth: int, status: int) -> None:  # noqa: F811
    deep = b"[" * depth + b"]" * depth
    body = b'{"model":"llama3.2","prompt":"x","stream":false,"x":' + deep + b"}"
    got, answer = await post(sim, "/api/generate", body)
    assert got == status, answer
    if status == 400:
        assert answer == {"error": "invalid character '[' exceeded max depth"}
    assert loads(sim) == (1 if status == 200 else 0)


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b'{"model":"llama3.2","messages":[]}', "[] is too short - 'messages'"),
        (
            b'{"model":"llama3.2","messages":[{"role":"user"}]}',
            "invalid message content type: <nil>",
        ),
        (
            b'{"model":"llama3.2","messages":[{"role":"user","content":1}]}',
            "invalid message content type: float64",
        ),
        (
            b'{"model":"llama3.2","messages":[{"role":"user","content":[{"type":"video"}]}]}',
            "invalid message format",
        ),
        (
            b'{"model":"llama3.2","messages":[{"role":"user","content":[{"type":"image_url",'
            b'"image_url":"http://x/a.png"}]}]}',
            "image URLs are not currently supported, please use base64 encoded data instead",
        ),
        (
            b'{"model":"llama3.2","messages":[{"role":"assistant","tool_calls":[{"function":'
            b'{"name":"f","arguments":"[1]"}}]}]}',
            "invalid tool call arguments",
        ),
        (
            b'{"model":"llama3.2","messages":[{"role":"user","content":"x"}],'
            b'"reasoning_effort":"huge"}',
            'invalid reasoning value: \'huge\' (must be "high", "medium", "low", "max", or "none")',
        ),
        (
            b'{"model":"llama3.2","messages":[{"role":"user","content":"x"}],"top_logprobs":21}',
            "top_logprobs must be between 0 and 20",
        ),
    ],
)
async def test_the_chat_middlewares_pre_load_400s(
    sim: SimOllama,  # noqa: F811
    body: bytes,
    message: str,
) -> None:
    status, answer = await post(sim, "/v1/chat/completions", body)
    assert status == 400
    assert answer["error"]["message"] == message
    assert answer["error"]["type"] == "invalid_request_error"
    assert loads(sim) == 0


async def test_tool_calls_make_content_optional(sim: SimOllama) -> None:  # noqa: F811
    body = (
        b'{"model":"llama3.2","messages":[{"role":"assistant","tool_calls":[{"function":'
        b'{"name":"f","arguments":"{}"}}]},{"role":"user","content":"x"}]}'
    )
    status, answer = await post(sim, "/v1/chat/completions", body)
    assert status == 200, answer
    assert loads(sim) == 1


async def test_top_logprobs_out_of_range_is_refused_before_the_model_is_read(
    sim: SimOllama,  # noqa: F811
) -> None:
    body = b'{"model":"llama3.2","prompt":"x","top_logprobs":21}'
    status, answer = await post(sim, "/api/generate", body)
    assert (status, answer) == (400, {"error": "top_logprobs must be between 0 and 20"})
    assert loads(sim) == 0


def _form(*parts: tuple[str, str | None, bytes]) -> bytes:
    chunks = []
    for name, filename, data in parts:
        extra = f'; filename="{filename}"' if filename else ""
        head = f'--B\r\nContent-Disposition: form-data; name="{name}"{extra}\r\n\r\n'
        chunks.append(head.encode() + data + b"\r\n")
    return b"".join(chunks) + b"--B--\r\n"


_AUDIO = "multipart/form-data; boundary=B"


async def test_transcription_reads_the_model_from_the_query_first(sim: SimOllama) -> None:  # noqa: F811
    body = _form(("model", None, b"nosuch"), ("file", "a.wav", b"RIFF"))
    status, answer = await post(
        sim, "/v1/audio/transcriptions?model=llama3.2", body, headers={"Content-Type": _AUDIO}
    )
    assert status == 200, answer
    assert loads(sim) == 1
    status, answer = await post(
        sim, "/v1/audio/transcriptions", body, headers={"Content-Type": _AUDIO}
    )
    assert status == 404 and answer["error"]["message"] == "model 'nosuch' not found"


@pytest.mark.parametrize(
    ("body", "content_type", "message"),
    [
        (_form(("file", "a.wav", b"RIFF")), _AUDIO, "model is required"),
        (_form(("model", None, b"llama3.2")), _AUDIO, "file is required: http: no such file"),
        (
            _form(("model", None, b"llama3.2"), ("file", "a.wav", b"")),
            _AUDIO,
            "audio file is empty",
        ),
        (
            b"{}",
            "application/json",
            "failed to parse multipart form: request Content-Type isn't multipart/form-data",
        ),
    ],
)
async def test_transcription_form_refusals(
    sim: SimOllama,  # noqa: F811
    body: bytes,
    content_type: str,
    message: str,
) -> None:
    status, answer = await post(
        sim, "/v1/audio/transcriptions", body, headers={"Content-Type": content_type}
    )
    assert status == 400 and answer["error"]["message"] == message
    assert loads(sim) == 0
