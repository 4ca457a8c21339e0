"""Each kind of scalar in consumers.yaml: what is accepted, and the message for what is not."""

from __future__ import annotations

import pytest

from gpugate.config.model import Address, Upstream
from tests.config.helpers import Found, errors, load, ollama


@pytest.mark.parametrize(
    ("written", "address"),
    [
        ("0.0.0.0:11434", Address("0.0.0.0", 11434)),
        ('"[::]:8188"', Address("::", 8188)),
        ('":8188"', Address("0.0.0.0", 8188)),
        (":8188", Address("0.0.0.0", 8188)),
        ("8188", Address("0.0.0.0", 8188)),
        ("localhost:8080", Address("localhost", 8080)),
    ],
)
def test_listen_addresses(written: str, address: Address) -> None:
    assert load(ollama(listen=written)).config.consumer("ollama").listen == address


@pytest.mark.parametrize(
    ("written", "upstream"),
    [
        ("http://127.0.0.1:11435", Upstream("http", "127.0.0.1", 11435)),
        ("http://localhost", Upstream("http", "localhost", 80)),
        ('"https://[::1]"', Upstream("https", "::1", 443)),
        ("http://127.0.0.1:11435/", Upstream("http", "127.0.0.1", 11435)),
    ],
)
def test_upstream_urls(written: str, upstream: Upstream) -> None:
    assert load(ollama(upstream=written)).config.consumer("ollama").upstream == upstream


@pytest.mark.parametrize(
    ("fields", "found"),
    [
        ({"envelope": "lots"}, Found(7, "envelope", "expected a size like '7.5GiB', got 'lots'")),
        (
            {"envelope": "3 parsecs"},
            Found(
                7,
                "envelope",
                "unknown size unit 'parsecs' in '3 parsecs' (use B, KiB, MiB, GiB, MB, GB)",
            ),
        ),
        (
            {"envelope": "yes"},
            Found(7, "envelope", "expected a size like '7.5GiB', got yes (a boolean)"),
        ),
        ({"envelope": "-5"}, Found(7, "envelope", "a size cannot be negative, got -5")),
        ({"max_body": "[1]"}, Found(7, "max_body", "expected a size like '7.5GiB', got a list")),
        (
            {"residency": "{ttl: forever}"},
            Found(7, "residency.ttl", "expected a duration like '15m', got 'forever'"),
        ),
        (
            {"residency": "{ttl: {m: 15}}"},
            Found(7, "residency.ttl", "expected a duration like '15m', got a mapping"),
        ),
        (
            {"residency": "{policy: sometimes}"},
            Found(
                7,
                "residency.policy",
                "unknown residency policy 'sometimes' "
                "(one of always_warm, keep_warm, load_on_demand)",
            ),
        ),
        (
            {"residency": "keep_warm"},
            Found(7, "residency", "expected a mapping with keys policy, ttl, got 'keep_warm'"),
        ),
        (
            {"class": "urgent"},
            Found(
                7,
                "class",
                "unknown priority class 'urgent' "
                "(one of production, interactive, background, benchmark, maintenance)",
            ),
        ),
        (
            {"class": "3"},
            Found(
                7,
                "class",
                "expected a priority class "
                "(production, interactive, background, benchmark, maintenance), got 3 (a number)",
            ),
        ),
        (
            {"runtime": "tgi"},
            Found(
                3,
                "runtime",
                "unknown runtime 'tgi' (one of ollama, comfyui, whisper, llama-server, vllm, http)",
            ),
        ),
        (
            {"listen": '"0.0.0.0:99999"'},
            Found(4, "listen", "port 99999 in '0.0.0.0:99999' is outside 1-65535"),
        ),
        (
            {"listen": '"::1:8188"'},
            Found(
                4, "listen", "write an IPv6 address in brackets, like '[::1]:8188', got '::1:8188'"
            ),
        ),
        (
            {"listen": "0.0.0.0:http"},
            Found(4, "listen", "expected a port number in '0.0.0.0:http', got 'http'"),
        ),
        (
            {"listen": "[8188]"},
            Found(4, "listen", "expected an address like '0.0.0.0:11434', got a list"),
        ),
        (
            {"upstream": "ftp://127.0.0.1:21"},
            Found(
                5,
                "upstream",
                "expected an http:// or https:// URL like 'http://127.0.0.1:11435', "
                "got 'ftp://127.0.0.1:21'",
            ),
        ),
        (
            {"upstream": "127.0.0.1:11435"},
            Found(
                5,
                "upstream",
                "expected an http:// or https:// URL like 'http://127.0.0.1:11435', "
                "got '127.0.0.1:11435'",
            ),
        ),
        (
            {"upstream": "http://127.0.0.1:11435/api"},
            Found(
                5,
                "upstream",
                "an upstream is scheme://host:port only, 'http://127.0.0.1:11435/api' has a path",
            ),
        ),
        ({"gpu": '"1"'}, Found(7, "gpu", "expected a whole number, got '1'")),
        ({"gpu": "yes"}, Found(7, "gpu", "expected a whole number, got yes (a boolean)")),
        ({"gpu": "1.5"}, Found(7, "gpu", "expected a whole number, got 1.5 (a number)")),
        ({"gpu": "-1"}, Found(7, "gpu", "expected a whole number (0 or more), got -1")),
        (
            {"queue_limit": "{n: 3}"},
            Found(7, "queue_limit", "expected a whole number, got a mapping"),
        ),
        (
            {"processes": "{commands: ollama serve}"},
            Found(6, "processes.commands", "expected a list, got 'ollama serve'"),
        ),
        (
            {"processes": "{commands: [42]}"},
            Found(6, "processes.commands[0]", "expected a string, got 42 (a number)"),
        ),
        (
            {"processes": "{names: ['']}"},
            Found(6, "processes.names[0]", "expected a non-empty string"),
        ),
        (
            {"envelope": "!bytes 12"},
            Found(
                7,
                "envelope",
                "cannot read this value: could not determine a constructor for the tag '!bytes'",
            ),
        ),
        (
            {"models": "[gemma3]"},
            Found(7, "models", "expected a mapping of entries by name, got a list"),
        ),
    ],
    ids=lambda value: value.path if isinstance(value, Found) else None,
)
def test_a_bad_consumer_value_is_reported_where_it_is(fields: dict[str, str], found: Found) -> None:
    expected = Found(found.line, f"consumers.ollama.{found.path}", found.message)
    assert errors(ollama(**fields)) == [expected]


@pytest.mark.parametrize(
    ("text", "found"),
    [
        (
            "gate:\n  database: 5\n",
            Found(2, "gate.database", "expected a file path, got 5 (a number)"),
        ),
        (
            "gate:\n  control: 127.0.0.1\n",
            Found(2, "gate.control", "expected an address like '0.0.0.0:11434', got '127.0.0.1'"),
        ),
        (
            "budget:\n  reserve: true\n",
            Found(2, "budget.reserve", "expected a size like '7.5GiB', got true (a boolean)"),
        ),
        (
            "gate: 5\n",
            Found(
                1,
                "gate",
                "expected a mapping with keys control, database, shutdown_grace, proc_root, "
                "nvml_library, control_tokens, control_public, history_retention, max_lease_ttl, "
                "agent_check, "
                "got 5 (a number)",
            ),
        ),
        ("gpus: {index: 0}\n", Found(1, "gpus", "expected a list, got a mapping")),
        (
            "gpus:\n  - index: 0\n  - index: one\n",
            Found(3, "gpus[1].index", "expected a whole number, got 'one'"),
        ),
        (
            "identities:\n  - name: lan\n    class: interactive\n    sources: [192.168.1.300/24]\n",
            Found(
                4,
                "identities[0].sources[0]",
                "'192.168.1.300/24' does not appear to be an IPv4 or IPv6 network",
            ),
        ),
        (
            "classes:\n  urgent: {max_wait: 1m}\n",
            Found(
                2,
                "classes.urgent",
                "unknown priority class 'urgent' "
                "(one of production, interactive, background, benchmark, maintenance)",
            ),
        ),
        (
            "classes:\n  production: 10m\n",
            Found(2, "classes.production", "expected a mapping with keys max_wait, got '10m'"),
        ),
        (
            "- consumers\n",
            Found(
                1,
                "",
                "expected a mapping with keys gate, budget, gpus, classes, queue, identities, "
                "consumers, external, got a list",
            ),
        ),
    ],
    ids=lambda value: value.path or "root" if isinstance(value, Found) else None,
)
def test_a_bad_value_elsewhere_is_reported_where_it_is(text: str, found: Found) -> None:
    assert errors(text)[0] == found
