"""The simulator against the real llama-server (build/llama-server), byte for byte where the
simulator claims to be faithful. Skipped when the real binary has not been built."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.ports import free_ports
from tests.sim.test_sim_llamaserver import card, request, start, wait_for

REAL = Path(__file__).resolve().parents[2] / "build" / "llama-server"
gguf_models = pytest.importorskip("tests.llamaserver.gguf_models")
pytestmark = pytest.mark.skipif(not REAL.exists(), reason="build/llama-server not built")

CHAT = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3}
SAME_BYTES = [
    ("/health", None, None),
    ("/nope", None, None),
    ("/completion", None, b"xx"),
    ("/completion", None, b""),
    ("/v1/completions", {"max_tokens": 3}, None),
    ("/v1/chat/completions", {}, None),
    ("/tokenize", {"content": "Hello world", "add_special": True, "with_pieces": True}, None),
    ("/detokenize", {"tokens": [1, 229, 153, 132, 75, 104]}, None),
    ("/v1/embeddings", {"input": "hi"}, None),
    ("/infill", {"input_prefix": "a", "input_suffix": "b"}, None),
]


@pytest.fixture
def both(tmp_path: Path) -> Iterator[tuple[str, str]]:
    model = gguf_models.write_tiny_llama(tmp_path / "tiny.gguf")
    real_port, sim_port = free_ports(2)
    real = subprocess.Popen([str(REAL), "-m", str(model), "--port", str(real_port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    sim = start(["-m", str(model)], card(tmp_path).directory, sim_port)
    real_url = f"http://127.0.0.1:{real_port}"

    def up() -> bool:
        try:
            return request(real_url + "/health")[0] == 200
        except OSError:
            return False

    try:
        wait_for(up, "the real server")
        yield real_url, f"http://127.0.0.1:{sim_port}"
    finally:
        for proc in (real, sim):
            proc.kill()
            proc.wait(10)


@pytest.mark.parametrize(("path", "body", "raw"), SAME_BYTES)
def test_same_status_and_bytes(both: tuple[str, str], path: str, body: object, raw: bytes) -> None:
    real_url, sim_url = both
    real = request(real_url + path, body, raw)
    sim = request(sim_url + path, body, raw)
    assert (sim[0], sim[1]) == (real[0], real[1])
    assert sim[2]["Content-Type"] == real[2]["Content-Type"]


@pytest.mark.parametrize("route", ["/v1/chat/completions", "/v1/completions", "/completion"])
def test_same_shape_and_counts(both: tuple[str, str], route: str) -> None:
    body = dict(CHAT) if "chat" in route else {"prompt": "Hi there", "max_tokens": 3}
    real, sim = (json.loads(request(u + route, body)[1]) for u in both)
    assert list(sim) == list(real)
    for key in ("usage", "tokens_evaluated", "tokens_predicted", "stop_type"):
        if key in real:
            want = real[key]
            if key == "usage":
                want = {**want, "prompt_tokens_details": sim["usage"]["prompt_tokens_details"]}
            assert sim[key] == want


def test_same_stream_framing(both: tuple[str, str]) -> None:
    body = {**CHAT, "stream": True, "stream_options": {"include_usage": True}}
    real, sim = (request(u + "/v1/chat/completions", body) for u in both)
    assert sim[2]["Content-Type"] == real[2]["Content-Type"] == "text/event-stream"
    real_events, sim_events = (r[1].split(b"\n\n") for r in (real, sim))
    assert len(sim_events) == len(real_events) and sim_events[-2:] == real_events[-2:]
    for a, b in zip(real_events[:-2], sim_events[:-2], strict=True):
        assert list(json.loads(a[6:])) == list(json.loads(b[6:]))


@pytest.mark.parametrize(
    "args",
    [["-np", "2"], ["-np", "2", "-c", "1024"], ["-np", "2", "-fit", "off"], ["-np", "3"]],
)
def test_same_slot_context(tmp_path: Path, args: list[str]) -> None:
    """A context left unset is the training context for each slot's KV stream under --fit
    (common/fit.cpp `n_ctx_max = hp_nct * n_streams`), the training context in all without
    it; a slot gets its share of the context either way."""
    model = gguf_models.write_tiny_llama(tmp_path / "tiny.gguf")
    real_port, sim_port = free_ports(2)
    real = subprocess.Popen([str(REAL), "-m", str(model), "--port", str(real_port), *args],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    sim = start(["-m", str(model), *args], card(tmp_path).directory, sim_port)
    urls = [f"http://127.0.0.1:{port}" for port in (real_port, sim_port)]

    def up(url: str) -> bool:
        try:
            return request(url + "/health")[0] == 200
        except OSError:
            return False

    try:
        seen = []
        for url in urls:
            wait_for(lambda url=url: up(url), url)
            props = json.loads(request(url + "/props")[1])
            models = json.loads(request(url + "/v1/models")[1])
            seen.append((props["default_generation_settings"]["n_ctx"],
                         models["data"][0]["meta"]["n_ctx"]))  # fmt: skip
        assert seen[0] == seen[1]
    finally:
        for proc in (real, sim):
            proc.kill()
            proc.wait(10)
