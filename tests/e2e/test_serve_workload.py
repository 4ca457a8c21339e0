"""`gpugate serve` as a subprocess over the fake NVML library, under a seeded random workload.

A simulated 16 GiB host (`gpugate sim run`: a Plex transcode holding 1.5 GiB and a simulated
Ollama with five models) is driven through the gate by 500 requests of every kind: native
and OpenAI routes, streaming or not, four classes, keep_alive values a client might send,
unloads, and clients that leave mid-stream. Meanwhile the gate's budget is read after
every sample it takes. Checked:

* at no sampled moment do committed + external + reserve (+ driver reserved) exceed the
  card, and no allocation ever failed on the simulated GPU (no OOM, no CPU offload);
* every answer is either the runtime's own or a capacity failure with its class and
  Retry-After;
* when the workload is over, no lease and no ticket is left.
"""

from __future__ import annotations

import asyncio
import json
import random
import signal
import textwrap
from collections import Counter

import aiohttp
import pytest

from tests.clihost import running_gate, running_host
from tests.ports import free_ports

pytestmark = pytest.mark.e2e

REQUESTS = 500
CONCURRENCY = 16
SEED = 20261130
MODELS = {  # name: (MiB, class in consumers.yaml, embedding)
    "gemma3:12b": (7796, "interactive", False),
    "qwen2.5:7b": (5700, "interactive", False),
    "llama3.2:3b": (3200, "background", False),
    "phi3:mini": (2400, "benchmark", False),
    "bge-m3": (2012, "background", True),
}


def host_yaml(ollama_port: int) -> str:
    models = "\n".join(
        f"    - {{name: '{name}', size: {mib}MiB, load_seconds: 0.05, "
        f"embedding: {str(emb).lower()}}}"
        for name, (mib, _, emb) in MODELS.items()
    )
    return (
        textwrap.dedent(f"""\
        gpus:
          - {{name: NVIDIA GeForce RTX 4080, total: 16GiB, reserved: 434MiB}}
        holders:
          - name: Plex Transcoder
            command: ["/usr/lib/plexmediaserver/Plex Transcoder", "-codec:0", "hevc"]
            bytes: 1536MiB
        ollama:
          listen: 127.0.0.1:{ollama_port}
          tokens_per_second: 2000
          keep_alive: 5m
          models:
        """)
        + models
        + "\n"
    )


def consumers_yaml(listen: int, control: int, upstream: int) -> str:
    models = "\n".join(
        # phi3 has no envelope: it is estimated, then measured.
        f"      {name}: {{class: {klass}"
        + (f", envelope: {mib}MiB}}" if name != "phi3:mini" else "}")
        for name, (mib, klass, _) in MODELS.items()
    )
    return (
        textwrap.dedent(f"""\
        gate:
          control: 127.0.0.1:{control}
          shutdown_grace: 5s
        budget:
          reserve: 1GiB
          reserve_max: 1GiB
          sample_interval: 100ms
          stale_after: 3s
          reclaim_timeout: 5s
        classes:
          production: {{max_wait: 20s}}
          interactive: {{max_wait: 10s}}
          background: {{max_wait: 4s}}
          benchmark: {{max_wait: 2s}}
        identities:
          - name: ops
            tokens: [ops-token]
            class: production
        consumers:
          ollama:
            runtime: ollama
            listen: 127.0.0.1:{listen}
            upstream: http://127.0.0.1:{upstream}
            class: interactive
            queue_limit: 12
            residency: {{policy: keep_warm, ttl: 20s}}
            processes: {{commands: ["ollama serve"]}}
            models:
        """)
        + models
        + textwrap.dedent("""
        external:
          plex:
            processes: {commands: ["Plex Transcoder"]}
        """)
    )


class Workload:
    def __init__(self, gate: str) -> None:
        self.gate = gate
        self.rng = random.Random(SEED)
        self.outcomes: Counter[str] = Counter()
        self.problems: list[str] = []

    def request(self) -> tuple[str, dict, dict, bool, bool]:
        rng = self.rng
        model = rng.choice(list(MODELS))
        embedding = MODELS[model][2]
        headers: dict[str, str] = {}
        roll = rng.random()
        if roll < 0.15:
            headers["Authorization"] = "Bearer ops-token"
        elif roll < 0.4:
            headers["X-GPUGate-Priority"] = rng.choice(["background", "benchmark"])
        stream = rng.random() < 0.5
        leave = stream and rng.random() < 0.1
        keep_alive = rng.choice([None, None, "5m", -1, "30s", 0, 3600])
        options = {"num_predict": rng.randint(1, 30)}
        if embedding:
            if rng.random() < 0.5:
                return "/api/embed", {"model": model, "input": ["a", "b"]}, headers, False, False
            return "/v1/embeddings", {"model": model, "input": "a"}, headers, False, False
        kind = rng.random()
        if kind < 0.05:
            return "/api/generate", {"model": model, "keep_alive": 0}, headers, False, False
        if kind < 0.45:
            body = {
                "model": model,
                "prompt": f"q{rng.random()}",
                "stream": stream,
                "options": options,
            }
            if keep_alive is not None:
                body["keep_alive"] = keep_alive
            return "/api/generate", body, headers, stream, leave
        if kind < 0.7:
            body = {
                "model": model,
                "stream": stream,
                "options": options,
                "messages": [{"role": "user", "content": "hi"}],
            }
            return "/api/chat", body, headers, stream, leave
        body = {
            "model": model,
            "stream": stream,
            "max_tokens": options["num_predict"],
            "messages": [{"role": "user", "content": "hi"}],
        }
        return "/v1/chat/completions", body, headers, stream, leave

    async def one(self, session: aiohttp.ClientSession) -> None:
        path, body, headers, stream, leave = self.request()
        async with session.post(self.gate + path, json=body, headers=headers) as resp:
            failure = resp.headers.get("X-GPUGate-Failure")
            if resp.status == 200:
                if leave:
                    await resp.content.readany()
                    self.outcomes["left mid-stream"] += 1
                    resp.close()
                    return
                data = await resp.read()
                if stream and path.startswith("/api/"):
                    lines = [json.loads(line) for line in data.splitlines()]
                    if "error" in lines[-1]:
                        self.problems.append(f"{path} {body['model']}: {lines[-1]}")
                self.outcomes["ok"] += 1
            elif resp.status == 503 and failure in (
                "QUEUE_FULL",
                "LEASE_TIMEOUT",
                "DEADLINE_CANNOT_BE_MET",
                "INSUFFICIENT_SCHEDULABLE_VRAM",
            ):
                assert int(resp.headers["Retry-After"]) >= 1
                self.outcomes[failure] += 1
            else:
                self.problems.append(
                    f"{path} {body.get('model')}: {resp.status} {failure} "
                    f"{(await resp.read())[:200]!r}"
                )

    async def run(self) -> None:
        queue: asyncio.Queue[int] = asyncio.Queue()
        for n in range(REQUESTS):
            queue.put_nowait(n)
        timeout = aiohttp.ClientTimeout(total=60)
        async with aiohttp.ClientSession(timeout=timeout) as session:

            async def worker() -> None:
                while not queue.empty():
                    queue.get_nowait()
                    await self.one(session)

            await asyncio.gather(*(worker() for _ in range(CONCURRENCY)))


async def watch_budget(control: str, stop: asyncio.Event, seen: list[dict]) -> None:
    """Read the gate's budget each time it has a new sample; record every violation."""
    async with aiohttp.ClientSession() as session:
        last_age = None
        while not stop.is_set():
            async with session.get(control + "/gate/v1/status") as resp:
                document = await resp.json()
            for gpu in document["gpus"]:
                if gpu["sample_age_seconds"] != last_age:
                    last_age = gpu["sample_age_seconds"]
                    seen.append(gpu)
            # One read per sample interval is enough to see every sample.
            await asyncio.sleep(0.05)


@pytest.fixture
def host_and_gate(tmp_path):
    ollama_port, listen, control = free_ports(3)
    host_file = tmp_path / "host.yaml"
    host_file.write_text(host_yaml(ollama_port))
    config = tmp_path / "consumers.yaml"
    config.write_text(consumers_yaml(listen, control, ollama_port))
    with running_host(host_file, tmp_path / "state", ollama_port) as host:
        # DEBUG: every lease is logged, which the shutdown test reads back.
        env = host.env(GPUGATE_LOG_LEVEL="DEBUG")
        with running_gate(config, env, listen, control) as gate:
            yield gate.listen, gate.control, host.gpu, gate.process, gate.stderr


async def test_500_random_requests_never_overcommit_the_card(host_and_gate):
    gate_url, control, gpu, process, _ = host_and_gate
    workload = Workload(gate_url)
    stop = asyncio.Event()
    samples: list[dict] = []
    watcher = asyncio.create_task(watch_budget(control, stop, samples))
    await workload.run()
    stop.set()
    await watcher

    assert workload.problems == []
    assert sum(workload.outcomes.values()) == REQUESTS
    # Many requests ran; the others met a capacity failure, which this workload provokes.
    assert workload.outcomes["ok"] >= REQUESTS // 4, workload.outcomes
    # The workload outlasts many samples; each one seen is checked below.
    assert len(samples) >= 20, len(samples)
    for gpu_row in samples:
        used = (
            gpu_row["committed_total"]
            + gpu_row["external_total"]
            + gpu_row["reserve"]
            + gpu_row["driver_reserved"]
        )
        assert used <= gpu_row["total"], json.dumps(gpu_row, indent=1)
    assert gpu.ooms() == []
    async with aiohttp.ClientSession() as session:
        async with session.get(control + "/gate/v1/status") as resp:
            document = await resp.json()
        async with session.get(control + "/metrics") as resp:
            metrics = await resp.text()
        async with session.get(control + "/gate/v1/events") as resp:
            events = (await resp.text()).splitlines()
    assert document["leases"] == [] and document["queue"] == []
    offloads = [n for n, line in enumerate(events) if '"partial_offload"' in line]
    assert not offloads, "\n".join(events[max(0, offloads[0] - 40) : offloads[0] + 1])
    assert 'failure_class="GPU_OOM"' not in metrics
    assert 'failure_class="MODEL_LOAD_FAILED"' not in metrics
    assert process.poll() is None


async def test_sigterm_lets_a_stream_finish_and_exits_cleanly(host_and_gate):
    gate_url, control, _, process, stderr = host_and_gate
    async with aiohttp.ClientSession() as session:
        # 2,000 tokens at 2,000 tokens/s: the stream outlives the signal by about a second.
        body = {"model": "gemma3:12b", "prompt": "x", "options": {"sim_tokens": 2000}}
        async with session.post(gate_url + "/api/generate", json=body) as resp:
            first = await resp.content.readline()
            assert b'"response"' in first
            process.send_signal(signal.SIGTERM)
            rest = await resp.read()
        # The stream ran to its end after the signal.
        assert json.loads(rest.splitlines()[-1])["done"] is True
        with pytest.raises(aiohttp.ClientConnectionError):
            async with session.get(control + "/gate/v1/status"):
                pass
    assert await asyncio.to_thread(process.wait, 30) == 0
    logged = []
    while (line := stderr.next()) is not None:
        logged.append(json.loads(line)["event"] if line.startswith("{") else line)
    assert logged[-2:] == ["lease_granted", "lease_released"], logged
