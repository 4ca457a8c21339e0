"""consumers.yaml → Config: values, defaults, and every way a value can be wrong."""

from __future__ import annotations

import ipaddress
import logging
from pathlib import Path

import hypothesis.strategies as st
import pytest
import yaml
from hypothesis import given, settings

from gpugate.config.loader import (
    ConfigError,
    ConfigIssue,
    Severity,
    load_config,
    load_config_text,
    load_config_with_warnings,
)
from gpugate.config.model import (
    DEFAULT_MAX_WAIT,
    Address,
    Config,
    Residency,
    Upstream,
)
from gpugate.core.classes import PriorityClass, ResidencyPolicy
from gpugate.core.units import GiB, MiB
from gpugate.runtimes.sections import RUNTIME_TABLE
from tests.config.helpers import SOURCE, Found, errors, load, ollama

# ---------------------------------------------------------------------------------------------
# Values that load


def test_a_minimal_consumer_gets_every_default() -> None:
    config = load(ollama()).config
    consumer = config.consumer("ollama")
    assert consumer.runtime == "ollama"
    assert consumer.listen == Address("0.0.0.0", 11434)
    assert consumer.upstream == Upstream("http", "127.0.0.1", 11435)
    assert consumer.processes.units == ("ollama.service",)
    assert (consumer.gpu, consumer.priority, consumer.residency) == (
        0,
        PriorityClass.INTERACTIVE,
        Residency(ResidencyPolicy.KEEP_WARM, None),
    )
    assert consumer.envelope is None and consumer.models == ()
    assert (consumer.queue_limit, consumer.max_body) == (32, None)
    # No max_body: the runtime's own limit, else the gate's own bound.
    assert (consumer.body_limit(100 * MiB), consumer.body_limit(None)) == (100 * MiB, 64 * MiB)
    assert config.source == SOURCE
    assert config.budget.reserve == GiB and config.gate.control == Address("127.0.0.1", 9411)


def test_sizes_durations_and_renamed_keys_are_read() -> None:
    text = ollama(
        envelope="7.5GiB",
        max_body='"1216348160"',
        residency="{policy: keep_warm, ttl: 15m}",
        **{"class": "production"},
    )
    text += "    models:\n      bge-m3: {class: background, residency: {ttl: 901s}}\n"
    consumer = load(text).config.consumer("ollama")
    assert consumer.envelope == int(7.5 * GiB)
    assert consumer.max_body == 1216348160
    assert consumer.body_limit(100 * MiB) == consumer.body_limit(None) == 1216348160
    assert consumer.residency == Residency(ResidencyPolicy.KEEP_WARM, 900.0)
    assert consumer.priority is PriorityClass.PRODUCTION
    model = consumer.model("bge-m3")
    assert model is not None
    assert model.priority is PriorityClass.BACKGROUND
    assert model.residency == Residency(ResidencyPolicy.KEEP_WARM, 901.0)


def test_keyed_sections_take_their_names_from_the_keys() -> None:
    text = ollama() + (
        "    models:\n"
        "      gemma3:12b: {envelope: 7.9GiB}\n"
        "      bge-m3:\n"
        "  comfyui:\n"
        "    runtime: comfyui\n"
        "    listen: 0.0.0.0:8188\n"
        "    upstream: http://127.0.0.1:8189\n"
        "    processes: {commands: [ComfyUI/main.py]}\n"
        "    models:\n"
        "      flux1-dev-fp8.safetensors: {envelope: 12GiB, class: production}\n"
        "external:\n"
        "  plex: {processes: {commands: [Plex Transcoder]}}\n"
    )
    config = load(text).config
    assert [c.name for c in config.consumers] == ["ollama", "comfyui"]
    assert [m.name for m in config.consumer("ollama").models] == ["gemma3:12b", "bge-m3"]
    assert config.consumer("ollama").models[1].envelope is None
    flux = config.consumer("comfyui").model("flux1-dev-fp8.safetensors")
    assert flux is not None and flux.envelope == 12 * GiB
    assert [e.name for e in config.external] == ["plex"]


def test_classes_are_merged_over_the_defaults_highest_first() -> None:
    text = ollama() + "classes:\n  background: {max_wait: 1h}\n  production: {max_wait: 15m}\n"
    classes = load(text).config.classes
    assert [c.priority for c in classes] == PriorityClass.ordered()
    waits = {c.priority: c.max_wait for c in classes}
    assert waits[PriorityClass.PRODUCTION] == 900.0
    assert waits[PriorityClass.BACKGROUND] == 3600.0
    assert waits[PriorityClass.INTERACTIVE] == DEFAULT_MAX_WAIT[PriorityClass.INTERACTIVE]


def test_identities_read_networks_and_tokens() -> None:
    text = ollama() + (
        "identities:\n"
        "  - name: lan\n"
        "    class: interactive\n"
        "    sources: [192.168.1.7/24, 10.0.0.5, 'fd00::/8']\n"
        "  - name: ops\n"
        "    class: background\n"
        "    max_class: production\n"
        "    tokens: [literal-token, 'env:OPS_TOKEN']\n"
    )
    lan, ops = load(text, {"OPS_TOKEN": "from-the-environment"}).config.identities
    assert lan.sources == (
        ipaddress.ip_network("192.168.1.0/24"),
        ipaddress.ip_network("10.0.0.5/32"),
        ipaddress.ip_network("fd00::/8"),
    )
    assert ops.tokens == ("literal-token", "from-the-environment")
    assert (ops.priority, ops.max_priority) == (PriorityClass.BACKGROUND, PriorityClass.PRODUCTION)


def test_a_key_without_a_value_takes_the_default() -> None:
    config = load(ollama(envelope="", gpu="~") + "gate:\nbudget: null\n").config
    assert config.consumer("ollama").envelope is None
    assert config.consumer("ollama").gpu == 0
    assert config.gate == Config().gate and config.budget == Config().budget


def test_anchors_and_aliases_are_followed() -> None:
    text = (
        "consumers:\n"
        "  whisper:\n"
        "    runtime: whisper\n"
        "    listen: 0.0.0.0:8080\n"
        "    upstream: http://127.0.0.1:8081\n"
        "    residency: &pinned {policy: always_warm}\n"
        "    processes: {commands: [whisper-server]}\n"
        "  mvoice:\n"
        "    runtime: http\n"
        "    listen: 0.0.0.0:7860\n"
        "    upstream: http://127.0.0.1:7861\n"
        "    residency: *pinned\n"
        "    processes: {commands: [mvoice]}\n"
    )
    config = load(text).config
    assert config.consumer("mvoice").residency.policy is ResidencyPolicy.ALWAYS_WARM


@pytest.mark.parametrize("text", ["", "# nothing configured yet\n", "---\n", "~\n"])
def test_an_empty_file_is_a_config_without_consumers(text: str) -> None:
    loaded = load(text)
    assert loaded.config.consumers == () and loaded.config.classes == Config().classes
    assert [(w.path, w.message) for w in loaded.warnings] == [
        ("consumers", "no consumers: the gate has nothing to front")
    ]


def test_load_config_reads_the_file_and_logs_warnings(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "consumers.yaml"
    path.write_text(ollama(upstream="http://10.0.0.2:11435"))
    with caplog.at_level(logging.WARNING, logger="gpugate.config.loader"):
        config = load_config(path, runtimes=RUNTIME_TABLE)
    assert config.source == path
    assert config.consumer("ollama").upstream.host == "10.0.0.2"
    assert [r.getMessage() for r in caplog.records] == [
        f"{path}:5: consumers.ollama.upstream: warning: 10.0.0.2 is not a loopback address: "
        "clients could bypass the gate by talking to it directly"
    ]


# ---------------------------------------------------------------------------------------------
# Values that do not


@pytest.mark.parametrize(
    ("text", "found"),
    [
        (
            ollama(resdency="{ttl: 5m}"),
            Found(
                7, "consumers.ollama.resdency", "unknown key 'resdency'; did you mean 'residency'?"
            ),
        ),
        (
            ollama(priority="background"),
            Found(7, "consumers.ollama.priority", "unknown key 'priority'; did you mean 'class'?"),
        ),
        (
            "consumer:\n  ollama: {}\n",
            Found(1, "consumer", "unknown key 'consumer'; did you mean 'consumers'?"),
        ),
        (
            ollama(colour="red"),
            Found(
                7,
                "consumers.ollama.colour",
                "unknown key 'colour'; expected one of runtime, listen, upstream, gpu, gpus, "
                "class, residency, envelope, queue_limit, max_body, processes, models, timeouts, "
                "limits, preempt, control, context_length, gpu_overhead, kv_cache_type, "
                "num_parallel, origins, sched_spread, ollama",
            ),
        ),
        (
            ollama(name="ollama"),
            Found(
                7,
                "consumers.ollama.name",
                "unknown key 'name'; expected one of runtime, listen, upstream, gpu, gpus, "
                "class, residency, envelope, queue_limit, max_body, processes, models, timeouts, "
                "limits, preempt, control, context_length, gpu_overhead, kv_cache_type, "
                "num_parallel, origins, sched_spread, ollama",
            ),
        ),
    ],
    ids=["close-match", "renamed-key", "section", "no-match", "key-field-inside-entry"],
)
def test_unknown_keys(text: str, found: Found) -> None:
    assert errors(text) == [found]


def test_missing_required_fields_are_reported_at_their_mapping() -> None:
    text = ollama(runtime=None, upstream=None) + (
        "identities:\n"
        "  - name: lan\n"
        "    sources: [192.168.1.0/24]\n"
        "gpus:\n"
        "  - reserve: 1GiB\n"
        "classes:\n"
        "  production: {}\n"
    )
    assert errors(text) == [
        Found(2, "consumers.ollama", "missing required field 'runtime'"),
        Found(2, "consumers.ollama", "missing required field 'upstream'"),
        Found(6, "identities[0]", "missing required field 'class'"),
        Found(9, "gpus[0]", "missing required field 'index'"),
        Found(11, "classes.production", "missing required field 'max_wait'"),
    ]


def test_a_required_key_without_a_value_is_reported_at_the_key() -> None:
    assert errors(ollama(runtime="")) == [
        Found(3, "consumers.ollama.runtime", "'runtime' needs a value")
    ]


def test_a_key_given_twice_is_an_error() -> None:
    text = (
        ollama()
        + "    listen: 0.0.0.0:8080\nconsumers: {}\nclasses:\n  production: {max_wait: 1m}\n"
    )
    text += "  Production: {max_wait: 2m}\n"
    assert errors(text) == [
        Found(7, "consumers.ollama.listen", "'listen' is given twice (first at line 4)"),
        Found(8, "consumers", "'consumers' is given twice (first at line 1)"),
        Found(11, "classes.Production", "'production' is given twice (first at line 10)"),
    ]


@pytest.mark.parametrize(
    ("environ", "token", "message"),
    [
        (
            {"GPUGATE_BATCH_TOKEN": " "},
            "env:GPUGATE_BATCH_TOKEN",
            "environment variable GPUGATE_BATCH_TOKEN is empty",
        ),
        ({}, "'env:'", "expected an environment variable name after 'env:'"),
        ({}, "''", "expected a non-empty string"),
    ],
    ids=["empty", "no-name", "blank-literal"],
)
def test_bad_tokens(environ: dict[str, str], token: str, message: str) -> None:
    text = "identities:\n  - name: batch\n    class: background\n    tokens:\n"
    text += f"      - {token}\n"
    assert errors(text, environ) == [Found(5, "identities[0].tokens[0]", message)]


def test_a_token_whose_variable_is_unset_is_a_warning_and_is_left_out() -> None:
    text = "identities:\n  - name: batch\n    class: background\n    tokens:\n"
    text += "      - literal-token\n      - env:GPUGATE_BATCH_TOKEN\n"
    loaded = load(text)
    assert loaded.config.identities[0].tokens == ("literal-token",)
    (warning,) = [w for w in loaded.warnings if w.unset_variable]
    assert (warning.line, warning.path, warning.unset_variable) == (
        6,
        "identities[0].tokens[1]",
        "GPUGATE_BATCH_TOKEN",
    )
    assert str(warning) == (
        "consumers.yaml:6: identities[0].tokens[1]: warning: "
        "environment variable GPUGATE_BATCH_TOKEN is not set"
    )


def test_an_identity_whose_only_token_is_unset_is_not_reported_as_matching_no_client() -> None:
    text = "identities:\n  - {name: ops, class: production, tokens: ['env:GPUGATE_OPS_TOKEN']}\n"
    loaded = load(text)
    assert [(w.path, w.unset_variable) for w in loaded.warnings if w.unset_variable] == [
        ("identities[0].tokens[0]", "GPUGATE_OPS_TOKEN")
    ]
    assert loaded.config.identities[0].tokens == ()


def test_every_error_is_reported_in_file_order() -> None:
    text = (
        "budget:\n"
        "  reserve: 3GiB\n"  # 2: found after the whole file is read
        "  sample_interval: often\n"  # 3
        "consumers:\n"
        "  ollama:\n"
        "    runtime: ollama\n"
        "    listen: 0.0.0.0:11434\n"
        "    upstream: http://127.0.0.1:11435\n"
        "    residency: {policy: keep_warm, ttl: forever}\n"  # 9
        "identities:\n"
        "  - name: batch\n"
        "    clas: background\n"  # 12
    )
    found = errors(text)
    assert [(f.line, f.path) for f in found] == [
        (3, "budget.sample_interval"),
        (9, "consumers.ollama.residency.ttl"),
        (11, "identities[0]"),
        (12, "identities[0].clas"),
    ]
    # The budget section failed, so the reserve/reserve_max rule did not run on a half-read
    # budget: a fixed sample_interval brings it out on the next run.
    assert all(f.path != "budget.reserve" for f in found)


def test_the_error_renders_one_issue_per_line() -> None:
    text = ollama(residency="{ttl: forever}", gpu='"1"')
    with pytest.raises(ConfigError) as info:
        load(text)
    assert str(info.value).splitlines() == [
        "consumers.yaml:7: consumers.ollama.residency.ttl: "
        "expected a duration like '15m', got 'forever'",
        "consumers.yaml:8: consumers.ollama.gpu: expected a whole number, got '1'",
    ]
    assert isinstance(info.value, ValueError)


def test_a_warning_renders_with_its_severity() -> None:
    issue = ConfigIssue(SOURCE, 5, "consumers.ollama.upstream", "not loopback", Severity.WARNING)
    assert str(issue) == "consumers.yaml:5: consumers.ollama.upstream: warning: not loopback"
    assert (
        str(ConfigIssue(Path("/etc/x.yaml"), None, "", "no such file"))
        == "/etc/x.yaml: no such file"
    )


@pytest.mark.parametrize(
    ("text", "line", "message"),
    [
        ("consumers: [a\n", 2, "invalid YAML: while parsing a flow sequence at line 1: "),
        (
            "consumers:\n  ollama:\n\t runtime: ollama\n",
            3,
            "invalid YAML: found character '\\t' that cannot start",
        ),
        (
            "a: 1\n---\nb: 2\n",
            2,
            "invalid YAML: expected a single document in the stream at line 1: ",
        ),
        ("budget: *nowhere\n", 1, "invalid YAML: found undefined alias 'nowhere'"),
    ],
    ids=["unclosed", "tab", "two-documents", "alias"],
)
def test_a_yaml_syntax_error_is_one_issue_with_its_line(text: str, line: int, message: str) -> None:
    [found] = errors(text)
    assert (found.line, found.path) == (line, "")
    assert found.message.startswith(message)


def test_a_missing_file_is_a_clear_error(tmp_path: Path) -> None:
    path = tmp_path / "nope.yaml"
    with pytest.raises(ConfigError) as info:
        load_config(path, runtimes=RUNTIME_TABLE)
    assert [(i.file, i.line, i.message) for i in info.value.issues] == [
        (path, None, "no such file")
    ]
    assert str(info.value) == f"{path}: no such file"


def test_a_directory_or_binary_file_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r": cannot read: Is a directory$"):
        load_config(tmp_path, runtimes=RUNTIME_TABLE)
    binary = tmp_path / "consumers.yaml"
    binary.write_bytes(b"consumers:\n  \xff\xfe: {}\n")
    with pytest.raises(ConfigError, match=r"not UTF-8 text \(byte 13 is 0xff\)$"):
        load_config_with_warnings(binary, runtimes=RUNTIME_TABLE)


def test_load_config_text_uses_the_process_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    text = "identities:\n  - {name: ops, class: production, tokens: ['env:GPUGATE_TEST_TOKEN']}\n"
    monkeypatch.setenv("GPUGATE_TEST_TOKEN", "s3cret")
    assert load_config_text(text, SOURCE, runtimes=RUNTIME_TABLE).identities[0].tokens == (
        "s3cret",
    )
    monkeypatch.delenv("GPUGATE_TEST_TOKEN")
    assert load_config_text(text, SOURCE, runtimes=RUNTIME_TABLE).identities[0].tokens == ()


# ---------------------------------------------------------------------------------------------
# Nothing crashes on input

_KEYS = st.sampled_from(
    ["consumers", "ollama", "runtime", "listen", "upstream", "residency", "policy", "ttl",
     "models", "gemma3:12b", "envelope", "class", "identities", "name", "sources", "tokens",
     "gpus", "index", "budget", "reserve", "gate", "control", "classes", "production",
     "max_wait", "processes", "commands", "external", "x"]
)  # fmt: skip
_SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(-(2**40), 2**40)
    | st.floats(allow_nan=True)
    | st.sampled_from(["15m", "7.5GiB", "ollama", "0.0.0.0:1", "http://127.0.0.1:1", "env:X"])
    | st.text(max_size=12)
)
_TREES = st.recursive(
    _SCALARS,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_KEYS, inner, max_size=4),
    max_leaves=20,
)


@settings(max_examples=100, deadline=None)
@given(tree=st.dictionaries(_KEYS, _TREES, max_size=5))
def test_any_yaml_loads_or_fails_with_config_error(tree: dict[str, object]) -> None:
    text = yaml.safe_dump(tree)
    try:
        load(text, {"X": "token"})
    except ConfigError as exc:
        assert exc.errors
        assert all(
            issue.line is None or 1 <= issue.line <= text.count("\n") + 1 for issue in exc.issues
        )


@settings(max_examples=150, deadline=None)
@given(text=st.text(max_size=80))
def test_any_text_loads_or_fails_with_config_error(text: str) -> None:
    try:
        load(text)
    except ConfigError as exc:
        assert exc.errors
