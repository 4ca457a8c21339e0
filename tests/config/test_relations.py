"""Rules across fields: each value is valid alone, the combination is an error or a warning."""

from __future__ import annotations

import pytest

from gpugate.config.loader import ConfigError, Severity
from tests.config.helpers import Found, errors, load, ollama, warnings

COMFYUI = (
    "  comfyui:\n"  # line 7 after ollama()
    "    runtime: comfyui\n"
    "    listen: {listen}\n"  # 9
    "    upstream: http://127.0.0.1:8189\n"  # 10
    "    processes: {{commands: [ComfyUI/main.py]}}\n"
)


def comfyui(listen: str = "0.0.0.0:8188") -> str:
    return COMFYUI.format(listen=listen)


def test_two_consumers_on_one_port() -> None:
    assert errors(ollama() + comfyui(listen="127.0.0.1:11434")) == [
        Found(
            9,
            "consumers.comfyui.listen",
            "port 11434 is already used by consumers.ollama.listen (line 4)",
        )
    ]


def test_a_consumer_on_the_control_port() -> None:
    assert errors(ollama(listen="0.0.0.0:9411")) == [
        Found(4, "consumers.ollama.listen", "port 9411 is already used by gate.control")
    ]
    text = "gate:\n  control: 127.0.0.1:8188\n" + ollama(listen="8188")
    assert errors(text)[0].message == "port 8188 is already used by gate.control (line 2)"


def test_an_upstream_that_points_back_at_the_gate() -> None:
    assert errors(ollama(upstream="http://127.0.0.1:11434")) == [
        Found(
            5,
            "consumers.ollama.upstream",
            "http://127.0.0.1:11434 is the gate's own listener (consumers.ollama.listen); "
            "point it at the port the runtime itself listens on",
        )
    ]
    # A listener bound to another interface is not reached through loopback.
    loaded = load(ollama(listen="192.168.1.5:11434", upstream="http://127.0.0.1:11434"))
    assert loaded.config.consumer("ollama").upstream.port == 11434


def test_a_ttl_on_a_policy_without_one() -> None:
    text = ollama(residency="{policy: always_warm, ttl: 5m}") + (
        "    models:\n"
        "      bge-m3: {residency: {policy: load_on_demand, ttl: 1m}}\n"
        "      gemma3:12b: {residency: {policy: keep_warm, ttl: 1m}}\n"
    )
    assert errors(text) == [
        Found(
            7,
            "consumers.ollama.residency.ttl",
            "a ttl applies only to keep_warm; always_warm never unloads for idleness",
        ),
        Found(
            9,
            "consumers.ollama.models.bge-m3.residency.ttl",
            "a ttl applies only to keep_warm; load_on_demand unloads as soon as its last "
            "request is done",
        ),
    ]


def test_a_consumer_on_a_gpu_that_is_not_listed() -> None:
    text = "gpus:\n  - index: 0\n  - index: 2\n" + ollama(gpu="1")
    assert errors(text) == [
        Found(10, "consumers.ollama.gpu", "GPU 1 is not in gpus (listed: 0, 2)")
    ]
    # The default GPU 0 counts too; the error is then at the consumer.
    assert errors("gpus:\n  - index: 1\n" + ollama()) == [
        Found(4, "consumers.ollama.gpu", "GPU 0 is not in gpus (listed: 1)")
    ]
    assert load(ollama(gpu="1")).config.consumer("ollama").gpu == 1  # no gpus: any index


def test_a_broken_gpus_list_reports_only_its_own_error() -> None:
    text = "gpus:\n  - index: 0\n  - index: 1\n    reserve: plenty\n" + ollama(gpu="1")
    assert [f.path for f in errors(text)] == ["gpus[1].reserve"]


def test_a_gpu_listed_twice_and_reserves_above_the_ceiling() -> None:
    text = (
        "budget:\n"
        "  reserve: 3GiB\n"
        "  reserve_max: 2GiB\n"
        "gpus:\n"
        "  - index: 0\n"
        "  - index: 0\n"
        "    reserve: 4GiB\n"
    ) + ollama()
    assert errors(text) == [
        Found(2, "budget.reserve", "reserve (3.0 GiB) is larger than reserve_max (2.0 GiB)"),
        Found(6, "gpus[1].index", "GPU 0 is already listed at gpus[0] (line 5)"),
        Found(
            7, "gpus[1].reserve", "reserve (4.0 GiB) is larger than budget.reserve_max (2.0 GiB)"
        ),
    ]


def test_sampling_intervals() -> None:
    assert errors("budget:\n  sample_interval: 0s\n" + ollama()) == [
        Found(2, "budget.sample_interval", "must be longer than 0s")
    ]
    assert errors("budget:\n  sample_interval: 2s\n  stale_after: 2s\n" + ollama()) == [
        Found(
            3,
            "budget.stale_after",
            "must be longer than sample_interval (2s), or every sample would be stale before "
            "the next one arrives",
        )
    ]


def test_identity_rules() -> None:
    text = ollama() + (
        "identities:\n"  # 7
        "  - name: lan\n"
        "    class: interactive\n"
        "    sources: [192.168.1.0/24]\n"  # 10
        "    tokens: [shared-secret]\n"
        "  - name: nobody\n"  # 12
        "    class: background\n"
        "  - name: lan\n"  # 14
        "    class: production\n"
        "    max_class: background\n"  # 16
        "    sources: [192.168.1.9/24]\n"  # 17
        "    tokens: [shared-secret]\n"  # 18
    )
    found = errors(text)
    assert found == [
        Found(12, "identities[1]", "matches no client: give sources, tokens or both"),
        Found(
            14, "identities[2].name", "identity 'lan' is already defined at identities[0] (line 8)"
        ),
        Found(
            16,
            "identities[2].max_class",
            "max_class background is below class production; it must be at least the "
            "identity's own class",
        ),
        Found(
            17,
            "identities[2].sources[0]",
            "192.168.1.0/24 is already a source of identity 'lan'",
        ),
        Found(
            18,
            "identities[2].tokens[0]",
            "the same token is already given for identity 'lan'",
        ),
    ]
    assert all("shared-secret" not in f.message for f in found)


def test_a_name_that_is_both_consumer_and_external() -> None:
    text = ollama() + "external:\n  ollama:\n    processes: {names: [ollama]}\n"
    assert errors(text) == [
        Found(
            8,
            "external.ollama",
            "'ollama' is also consumers.ollama (line 2); each owner needs its own name",
        )
    ]


def test_model_overrides_are_allowed_on_any_runtime() -> None:
    text = ollama() + comfyui() + "    models:\n      flux1-dev.safetensors: {envelope: 12GiB}\n"
    assert load(text).config.consumer("comfyui").models[0].name == "flux1-dev.safetensors"


def test_a_broken_consumer_is_left_out_of_the_rules_across_consumers() -> None:
    # comfyui repeats ollama's port, but its own error comes first and is the only one.
    text = ollama() + comfyui(listen="0.0.0.0:11434") + "    envelope: huge\n"
    assert [f.path for f in errors(text)] == ["consumers.comfyui.envelope"]


def test_warnings_leave_the_file_loadable() -> None:
    text = ollama(upstream="http://192.168.1.20:11435", processes=None) + (
        "  mvoice:\n"  # 6
        "    runtime: http\n"
        "    listen: 7860\n"
        "    upstream: http://localhost:7861\n"
        "    processes: {}\n"  # 10
        "external:\n"
        "  plex:\n"  # 12
        "  tdarr: {processes: {commands: [Tdarr_Node]}}\n"
    )
    assert warnings(text) == [
        Found(
            2,
            "consumers.ollama.processes",
            "no units, commands or names: its VRAM will be counted as external 'other'",
        ),
        Found(
            5,
            "consumers.ollama.upstream",
            "192.168.1.20 is not a loopback address: clients could bypass the gate by talking "
            "to it directly",
        ),
        Found(
            10,
            "consumers.mvoice.processes",
            "no units, commands or names: its VRAM will be counted as external 'other'",
        ),
        Found(
            12,
            "external.plex.processes",
            "no units, commands or names: it can never match a process",
        ),
    ]


def test_loopback_upstreams_raise_no_warning() -> None:
    for upstream in (
        "http://127.0.0.1:11435",
        "http://127.8.0.1:11435",
        "http://localhost:1",
        '"http://[::1]:1"',
    ):
        assert warnings(ollama(upstream=upstream)) == []


def test_errors_carry_the_warnings_found_with_them() -> None:
    text = ollama(upstream="http://10.0.0.1:11435") + comfyui() + "    envelope: big\n"
    with pytest.raises(ConfigError) as info:
        load(text)
    assert [(i.line, i.path, i.severity) for i in info.value.issues] == [
        (5, "consumers.ollama.upstream", Severity.WARNING),
        (12, "consumers.comfyui.envelope", Severity.ERROR),
    ]
    assert info.value.errors == info.value.issues[1:]


def test_a_maximum_lease_ttl_under_the_shortest_ttl() -> None:
    assert errors("gate:\n  max_lease_ttl: 500ms\n" + ollama()) == [
        Found(2, "gate.max_lease_ttl", "must be at least 1s, the shortest ttl a lease has")
    ]
    assert load("gate:\n  max_lease_ttl: 10m\n" + ollama()).config.gate.max_lease_ttl == 600.0


def test_rewarm_on_a_model_that_unloads_at_once() -> None:
    text = ollama(residency="{policy: load_on_demand}") + (
        "    models:\n"
        "      bge-m3: {rewarm: true}\n"
        "      gemma3:12b: {rewarm: true, residency: {policy: keep_warm, ttl: 10m}}\n"
        "      qwen2.5:7b: {rewarm: maybe}\n"
    )
    on_demand = Found(
        9,
        "consumers.ollama.models.bge-m3.rewarm",
        "rewarm applies to keep_warm and always_warm; a load_on_demand model unloads "
        "as soon as its last request is done, so there is nothing to warm again",
    )
    assert errors(text) == [
        on_demand,
        Found(
            11, "consumers.ollama.models.qwen2.5:7b.rewarm", "expected true or false, got 'maybe'"
        ),
    ]
    assert errors(text.replace("{rewarm: maybe}", "{rewarm: false}")) == [on_demand]


def test_rewarm_defaults_by_policy() -> None:
    text = ollama(residency="{policy: keep_warm}") + (
        "    models:\n"
        "      bge-m3: {rewarm: true}\n"
        "      gemma3:12b: {residency: {policy: always_warm}}\n"
        "      qwen2.5:7b: {residency: {policy: always_warm}, rewarm: false}\n"
        "      phi3: {}\n"
    )
    consumer = load(text).config.consumer("ollama")
    models = {m.name: m for m in consumer.models}
    rewarms = {name: m.rewarms(m.residency or consumer.residency) for name, m in models.items()}
    assert rewarms == {"bge-m3": True, "gemma3:12b": True, "qwen2.5:7b": False, "phi3": False}


def test_the_queue_section_is_read_with_its_defaults() -> None:
    config = load("queue:\n  equal_class_grace: 5s\n  swap_overtakes: 0\n" + ollama()).config
    assert config.queue.equal_class_grace == 5.0 and config.queue.swap_overtakes == 0
    assert (config.queue.swap_hold, config.queue.yield_after) == (20.0, 15.0)
    assert config.queue.swap_window == 300.0


def test_a_bad_queue_value_is_reported_where_it_is() -> None:
    assert errors("queue:\n  swap_hold: soon\n" + ollama())[0].line == 2
    assert errors("queue:\n  swap_overtakes: -1\n" + ollama()) == [
        Found(2, "queue.swap_overtakes", "expected a whole number (0 or more), got -1")
    ]


def test_a_grace_no_shorter_than_a_max_wait_is_a_warning() -> None:
    text = "classes:\n  interactive: {max_wait: 20s}\nqueue:\n  equal_class_grace: 30s\n"
    assert warnings(text + ollama()) == [
        Found(
            4,
            "queue.equal_class_grace",
            "30s is not shorter than class interactive's max_wait (20s): an interactive "
            "request that must evict an idle interactive model is refused "
            "DEADLINE_CANNOT_BE_MET",
        )
    ]
