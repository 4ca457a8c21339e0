"""The simulated Ollama reads bodies and names as Ollama's Go code does."""

from __future__ import annotations

import aiohttp
import pytest

from gpugate.sim.ollama.binding import BindError, GoType, Struct, bind
from gpugate.sim.ollama.catalog import ModelName
from gpugate.sim.ollama.server import SimOllama
from tests.sim.test_sim_ollama import client, make_sim, oai, sim  # noqa: F401  (fixtures)

GENERATE = Struct(
    "api.GenerateRequest",
    {
        "model": GoType.STRING,
        "prompt": GoType.STRING,
        "keep_alive": GoType.DURATION,
        "options": GoType.OPTIONS,
    },
)


def test_keys_fold_to_fields_and_the_last_duplicate_wins() -> None:
    body = b'{"Model":"a","MODEL":"b","keep_alive":"1s","\\u212aeep_alive":"2m","PROMPT":"x"}'
    # api.Duration decodes each member as it comes: the last one's two minutes remain
    assert bind(body, GENERATE) == {"model": "b", "keep_alive": 120_000_000_000, "prompt": "x"}


def test_a_null_keep_alive_after_a_value_leaves_it_unset() -> None:
    assert (
        bind(b'{"model":"m","keep_alive":"1h","Keep_Alive":null}', GENERATE)["keep_alive"] is None
    )


def test_strings_keep_lone_surrogates_and_bad_bytes_as_replacement_characters() -> None:
    bound = bind(b'{"model":"m","prompt":"\\ud800 \xff\xfe \\ud83d\\ude00"}', GENERATE)
    assert bound["prompt"] == "\ufffd \ufffd\ufffd \U0001f600"


def test_big_numbers_fail_only_where_go_converts_them() -> None:
    assert bind(b'{"model":"m","n":1e400,"prompt":"x"}', GENERATE)["prompt"] == "x"
    # api.Duration's inner json.Unmarshal fails with a type error, which the outer
    # decoder returns at once with the field's context (decode.go addErrorContext).
    with pytest.raises(BindError, match=r"1e400 into Go struct field GenerateRequest\.keep_alive"):
        bind(b'{"model":"m","keep_alive":1e400}', GENERATE)
    with pytest.raises(BindError, match=r"GenerateRequest\.options of type float64"):
        bind(b'{"model":"m","options":{"temperature":1e400}}', GENERATE)


def test_a_second_options_object_merges_into_the_first() -> None:
    body = b'{"options":{"num_ctx":8,"seed":1},"Options":{"seed":2}}'
    assert bind(body, GENERATE)["options"] == {"num_ctx": 8, "seed": 2}


@pytest.mark.parametrize(
    ("text", "key"),
    [
        ("M", "registry.ollama.ai/library/m:latest"),
        ("library/m:latest", "registry.ollama.ai/library/m:latest"),
        ("https://registry.ollama.ai/library/M", "registry.ollama.ai/library/m:latest"),
        ("team/skill/m", "registry.ollama.ai/team/skill/m:latest"),
    ],
)
def test_names_parse_as_parsename(text: str, key: str) -> None:
    name = ModelName.parse(text)
    assert name is not None and name.key == key


@pytest.mark.parametrize("text", [" m", "m@sha256:00", "te.am/m", "é"])
def test_names_parsename_refuses(text: str) -> None:
    assert ModelName.parse(text) is None


async def test_any_spelling_of_a_name_and_of_its_keys_loads_the_model(sim: SimOllama) -> None:  # noqa: F811
    async with aiohttp.ClientSession() as session:
        for body in (
            b'{"Model":"LIBRARY/Llama3.2","Prompt":"hi","Keep_Alive":"1m","stream":false}',
            b'{"model":"registry.ollama.ai/library/llama3.2:latest","prompt":"\\ud800"}',
        ):
            async with session.post(sim.url + "/api/generate", data=body) as resp:
                assert resp.status == 200, await resp.text()
                await resp.read()
    runner = sim.state().runner("llama3.2:latest")
    assert runner is not None and sim.state().counters.loads == 1
