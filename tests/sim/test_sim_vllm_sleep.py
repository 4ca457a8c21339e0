"""Sleep mode of the simulated `vllm serve`: routes, memory seen through the real pynvml over
the fake library, requests while asleep, and how long sleeping and waking take."""

from __future__ import annotations

import ctypes
import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pynvml
import pytest

from gpugate.core.units import GiB, MiB
from gpugate_sim.device import SimulatedGpuHost
from gpugate_sim.vllm import SimVllm, VllmServerSpec

WAIT = 20.0
CONTEXT, OVERHEAD, WEIGHTS = 500 * MiB, 512 * MiB, 1200 * MiB
RESIDUAL = CONTEXT + OVERHEAD
UP = 8 * GiB
"""0.5 of the fixture's 16 GiB card."""


def spec(**changes: object) -> VllmServerSpec:
    values: dict[str, object] = {
        "listen": "127.0.0.1:0",
        "served_model_names": ("qwen",),
        "gpu_memory_utilization": 0.5,
        "enable_sleep_mode": True,
        "dev_mode": True,
        "context": CONTEXT,
        "overhead": OVERHEAD,
        "weights": WEIGHTS,
        "tokens_per_second": 1000.0,
    }
    values.update(changes)
    return VllmServerSpec(**values)  # type: ignore[arg-type]


@pytest.fixture
def nvml(fakenvml_loaded: ctypes.CDLL, sim_host: SimulatedGpuHost) -> Iterator[None]:
    pynvml.nvmlInit()
    try:
        yield
    finally:
        pynvml.nvmlShutdown()


def nvml_used(pid: int) -> int:
    """What NVML reports the process holds (0 when it is not listed)."""
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    for proc in pynvml.nvmlDeviceGetComputeRunningProcesses(handle):
        if proc.pid == pid:
            return int(proc.usedGpuMemory)
    return 0


def post(url: str, path: str, **kwargs: object) -> httpx.Response:
    return httpx.post(url + path, timeout=WAIT, **kwargs)  # type: ignore[arg-type]


def sleeping(url: str) -> bool:
    answer = httpx.get(url + "/is_sleeping", timeout=WAIT)
    assert answer.status_code == 200
    return bool(answer.json()["is_sleeping"])


def chat(url: str, **body: object) -> httpx.Response:
    payload = {"model": "qwen", "messages": [{"role": "user", "content": "hi"}], **body}
    return post(url, "/v1/chat/completions", json=payload)


def text_of(answer: httpx.Response) -> str:
    assert answer.status_code == 200, answer.text
    return str(answer.json()["choices"][0]["message"]["content"])


def test_sleep_levels_free_all_but_the_residual_and_wake_takes_it_back(
    nvml: None, sim_host: SimulatedGpuHost
) -> None:
    with SimVllm(spec(), sim_host.directory) as sim:
        url = sim.url
        assert url is not None
        assert nvml_used(sim.pid) == UP and not sleeping(url)
        normal = text_of(chat(url, max_tokens=3))
        assert normal == "The quick brown"

        first = post(url, "/sleep?level=1")
        assert (first.status_code, first.content) == (200, b"")
        assert nvml_used(sim.pid) == RESIDUAL and sleeping(url)
        assert post(url, "/wake_up").status_code == 200
        assert nvml_used(sim.pid) == UP and not sleeping(url)
        assert text_of(chat(url, max_tokens=3)) == normal

        assert post(url, "/sleep?level=2").status_code == 200
        assert nvml_used(sim.pid) == RESIDUAL and sleeping(url)
        # vLLM's recipe after level 2: weights memory, reload_weights, then the KV cache.
        assert post(url, "/wake_up?tags=weights").status_code == 200
        assert nvml_used(sim.pid) == RESIDUAL + WEIGHTS and sleeping(url)
        assert post(url, "/wake_up?tags=kv_cache").status_code == 200
        assert nvml_used(sim.pid) == UP and not sleeping(url)
        # The weights came back mapped but empty: what they generate is garbage.
        assert text_of(chat(url, max_tokens=3)) == "!!!"
        reload = post(url, "/collective_rpc", json={"method": "reload_weights"})
        assert reload.status_code == 200
        assert text_of(chat(url, max_tokens=3)) == normal


def test_sleeping_twice_or_waking_an_awake_engine_changes_nothing(
    nvml: None, sim_host: SimulatedGpuHost
) -> None:
    with SimVllm(spec(), sim_host.directory) as sim:
        url = sim.url
        assert url is not None
        assert post(url, "/wake_up").status_code == 200
        assert nvml_used(sim.pid) == UP
        assert post(url, "/sleep").status_code == 200  # level defaults to 1
        assert post(url, "/sleep?level=2").status_code == 200
        assert nvml_used(sim.pid) == RESIDUAL
        assert post(url, "/wake_up?tags=bogus").status_code == 200
        assert nvml_used(sim.pid) == RESIDUAL and sleeping(url)
        assert post(url, "/wake_up").status_code == 200
        assert nvml_used(sim.pid) == UP
        # Level 1 (not 2) was the sleep that unmapped the weights: they come back intact.
        assert text_of(chat(url, max_tokens=1)) == "The"


def test_a_request_while_asleep_waits_for_the_wake(sim_host: SimulatedGpuHost) -> None:
    with SimVllm(spec(), sim_host.directory) as sim:
        url = sim.url
        assert url is not None
        assert post(url, "/sleep?level=1").status_code == 200
        answers: list[httpx.Response] = []
        waiter = threading.Thread(target=lambda: answers.append(chat(url, max_tokens=2)))
        waiter.start()
        waiter.join(timeout=0.5)
        assert waiter.is_alive() and not answers, "a sleeping engine queues the request"
        assert post(url, "/wake_up").status_code == 200
        waiter.join(timeout=WAIT)
        assert text_of(answers[0]) == "The quick"


def test_a_sleep_aborts_the_requests_in_flight(sim_host: SimulatedGpuHost) -> None:
    with SimVllm(spec(tokens_per_second=10.0), sim_host.directory) as sim:
        url = sim.url
        assert url is not None
        events: list[dict] = []
        streaming = threading.Event()

        def stream() -> None:
            payload = {"model": "qwen", "prompt": "hi", "stream": True}
            with httpx.stream("POST", url + "/v1/completions", json=payload, timeout=WAIT) as r:
                for line in r.iter_lines():
                    if line.startswith("data: {"):
                        events.append(json.loads(line[len("data: ") :]))
                        streaming.set()

        reader = threading.Thread(target=stream)
        reader.start()
        assert streaming.wait(WAIT), "the stream never started"
        assert post(url, "/sleep?level=1").status_code == 200
        reader.join(timeout=WAIT)
        assert events[-1]["choices"][0]["finish_reason"] == "abort"
        assert len(events) < 16


def test_waking_from_level_1_copies_and_level_2_reloads(sim_host: SimulatedGpuHost) -> None:
    timing = spec(load_seconds=0.6, wake_seconds=0.3, sleep_seconds=0.2)
    with SimVllm(timing, sim_host.directory) as sim:
        url = sim.url
        assert url is not None
        for path, least in (
            ("/sleep?level=1", 0.2),
            ("/wake_up", 0.3),
            ("/sleep?level=2", 0.0),
            ("/wake_up", 0.0),
        ):
            started = time.monotonic()
            assert post(url, path).status_code == 200
            assert time.monotonic() - started >= least, path
        started = time.monotonic()
        assert post(url, "/collective_rpc", json={"method": "reload_weights"}).is_success
        assert time.monotonic() - started >= 0.6


def test_the_routes_need_dev_mode(sim_host: SimulatedGpuHost) -> None:
    with SimVllm(spec(dev_mode=False), sim_host.directory) as sim:
        url = sim.url
        assert url is not None
        missing = post(url, "/sleep?level=1")
        assert (missing.status_code, missing.json()) == (404, {"detail": "Not Found"})
        assert httpx.get(url + "/is_sleeping").status_code == 404


def test_dev_mode_without_sleep_mode_frees_nothing(nvml: None, sim_host: SimulatedGpuHost) -> None:
    with SimVllm(spec(enable_sleep_mode=False), sim_host.directory) as sim:
        url = sim.url
        assert url is not None
        refused = post(url, "/sleep?level=1")
        assert refused.status_code == 400
        assert refused.json()["error"]["type"] == "BadRequestError"
        assert nvml_used(sim.pid) == UP


def test_a_wake_that_does_not_fit_fails_and_stays_asleep(
    nvml: None, sim_host: SimulatedGpuHost, tmp_path: Path
) -> None:
    with SimVllm(spec(), sim_host.directory) as sim:
        url = sim.url
        assert url is not None
        assert post(url, "/sleep?level=1").status_code == 200
        # Another server takes the freed memory meanwhile.
        with SimVllm(spec(gpu_memory_utilization=0.6), sim_host.directory) as other:
            assert nvml_used(other.pid) > 9 * GiB
            failed = post(url, "/wake_up")
            assert failed.status_code == 500
            assert failed.json()["error"]["code"] == 500
            assert sleeping(url) and nvml_used(sim.pid) == RESIDUAL
        assert sim_host.ooms(), "the failed remap is an OOM the host records"
