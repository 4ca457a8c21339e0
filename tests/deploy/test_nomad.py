"""gpugate/share/deploy/nomad/gpugate.nomad.hcl parses as HCL2 (python-hcl2) and says what the
gate needs: a system job on the host's network and PIDs, the NVIDIA runtime without a GPU
taken from the device plugin, a consumers.yaml that passes `gpugate check`, its tokens and
state, and a service with a check for every port.

No `nomad` binary can be had here (Debian does not package it), so `nomad job validate`
does not run: the job is checked structurally, its docker task's options against the
driver's own list."""

from __future__ import annotations

import posixpath
import re
import textwrap
from functools import cache
from pathlib import Path
from typing import Any

import hcl2
from hcl2 import SerializationOptions

from gpugate.config.model import Scope, token_scopes
from gpugate.runtimes.sections import load_config_text_with_warnings
from tests.deploy.manifests import (
    NOMAD_JOB,
    configmap_text,
    gpugate_check,
    image_uid_gid,
    token_files,
)

DOCKER_TASK_OPTIONS = frozenset(
    {
        "advertise_ipv6_address",
        "args",
        "auth",
        "auth_soft_fail",
        "cap_add",
        "cap_drop",
        "cgroupns",
        "command",
        "container_exists_attempts",
        "cpu_cfs_period",
        "cpu_hard_limit",
        "cpuset_cpus",
        "devices",
        "dns_options",
        "dns_search_domains",
        "dns_servers",
        "entrypoint",
        "extra_hosts",
        "force_pull",
        "group_add",
        "healthchecks",
        "hostname",
        "image",
        "image_pull_timeout",
        "init",
        "interactive",
        "ipc_mode",
        "ipv4_address",
        "ipv6_address",
        "isolation",
        "labels",
        "load",
        "logging",
        "mac_address",
        "memory_hard_limit",
        "mount",
        "mounts",
        "network_aliases",
        "network_mode",
        "oom_score_adj",
        "pid_mode",
        "pids_limit",
        "port_map",
        "ports",
        "privileged",
        "readonly_rootfs",
        "runtime",
        "security_opt",
        "shm_size",
        "storage_opt",
        "sysctl",
        "tty",
        "ulimit",
        "userns_mode",
        "uts_mode",
        "volume_driver",
        "volumes",
        "work_dir",
    }
)
"""Every option of a docker task's `config` block: the keys of `taskConfigSpec` in
https://github.com/hashicorp/nomad/blob/aa026cc99cfb74a77e519a1c1f0c78ba1b452705/drivers/docker/config.go
(a misspelt option is an error there, as here)."""

OPTIONS = SerializationOptions(
    with_comments=False, explicit_blocks=False, strip_string_quotes=True, preserve_heredocs=True
)


def heredoc(value: str) -> str:
    """A heredoc's text as HCL makes it: `<<-` strips the indentation common to its lines."""
    opening, _, rest = value.partition("\n")
    flush = opening.startswith("<<-")
    marker = opening.removeprefix("<<-" if flush else "<<")
    body, _, closing = rest.rpartition("\n")
    assert closing.strip() == marker, value
    body += "\n"
    return textwrap.dedent(body) if flush else body


@cache
def job_file() -> dict[str, Any]:
    with NOMAD_JOB.open() as f:
        return hcl2.load(f, serialization_options=OPTIONS)


def job() -> dict[str, Any]:
    [block] = job_file()["job"]
    [(name, body)] = block.items()
    assert name == "gpugate"
    return body


def group() -> dict[str, Any]:
    [block] = job()["group"]
    [(_, body)] = block.items()
    return body


def task() -> dict[str, Any]:
    [block] = group()["task"]
    [(name, body)] = block.items()
    assert name == "gpugate"
    return body


def docker_config() -> dict[str, Any]:
    [config] = task()["config"]
    return config


def templates() -> dict[str, dict[str, Any]]:
    return {t["destination"]: t for t in task()["template"]}


def consumers_yaml() -> str:
    return heredoc(templates()["local/consumers.yaml"]["data"])


def in_task(destination: str) -> str:
    """Where the docker driver shows a task directory's file: local/x is /local/x."""
    return "/" + destination


def test_the_job_is_a_system_job_on_nodes_with_the_nvidia_runtime():
    assert job()["type"] == "system"
    [constraint] = job()["constraint"]
    assert constraint == {
        "attribute": "${attr.driver.docker.runtimes}",
        "operator": "set_contains",
        "value": "nvidia",
    }
    assert job()["update"] == [{"max_parallel": 1, "stagger": "30s"}]


def test_the_task_shares_the_hosts_network_and_pids():
    [network] = group()["network"]
    assert network["mode"] == "host"
    config = docker_config()
    assert task()["driver"] == "docker"
    assert config["network_mode"] == "host"
    assert config["pid_mode"] == "host"


def test_the_docker_options_are_the_drivers():
    assert set(docker_config()) <= DOCKER_TASK_OPTIONS, set(docker_config()) - DOCKER_TASK_OPTIONS


def test_the_task_sees_every_card_through_the_nvidia_runtime_without_a_device():
    config = docker_config()
    assert config["runtime"] == "nvidia"
    [env] = task()["env"]
    assert env["NVIDIA_VISIBLE_DEVICES"] == "all"
    assert env["NVIDIA_DRIVER_CAPABILITIES"] == "utility"
    [resources] = task()["resources"]
    assert set(resources) == {"cpu", "memory"}
    assert "device" not in _keys(job_file())


def _keys(node: Any) -> set[str]:
    if isinstance(node, dict):
        return set(node) | {k for v in node.values() for k in _keys(v)}
    if isinstance(node, list):
        return {k for v in node for k in _keys(v)}
    return set()


def test_the_task_runs_unprivileged():
    config = docker_config()
    uid, gid = image_uid_gid()
    assert task()["user"] == f"{uid}:{gid}"
    assert config["readonly_rootfs"] is True
    assert config["cap_drop"] == ["all"]
    assert "cap_add" not in config and "privileged" not in config
    assert "no-new-privileges" in config["security_opt"]


def test_the_embedded_consumers_yaml_passes_gpugate_check(tmp_path):
    done = gpugate_check(consumers_yaml(), tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "ok — 4 consumers (ollama, comfyui, whisper, vllm)" in done.stdout
    warnings = [line for line in done.stderr.splitlines() if line]
    assert warnings and all("token file /secrets/" in w for w in warnings), warnings
    # It is plain YAML: nothing in it is a template expression or an HCL interpolation.
    assert "{{" not in consumers_yaml() and "${" not in consumers_yaml()


def _loaded(tokens: Path):
    text = consumers_yaml().replace("file:/secrets/", f"file:{tokens}/")
    return load_config_text_with_warnings(text, tokens / "consumers.yaml")


def test_the_gate_reads_the_rendered_file_and_tokens(tmp_path):
    args = docker_config()["args"]
    assert docker_config()["entrypoint"] == ["gpugate"]
    assert args[:2] == ["serve", "--config"]
    assert args[2] == in_task("local/consumers.yaml")
    rendered = {in_task(d): t for d, t in templates().items()}
    uid, gid = image_uid_gid()
    for path in token_files(consumers_yaml()):
        template = rendered[path]
        assert (template["uid"], template["gid"], template["perms"]) == (uid, gid, "0400")
        (tmp_path / posixpath.basename(path)).write_text(f"token-of-{posixpath.basename(path)}")
    loaded = _loaded(tmp_path)
    assert loaded.warnings == ()
    gate = loaded.config.gate
    assert gate.control_public is False
    assert {str(t): token_scopes(t) for t in gate.control_tokens} == {
        "token-of-control.token": frozenset(Scope),
        "token-of-read.token": frozenset({Scope.READ}),
    }
    # Every token comes from the job's Nomad variable, rendered into the task's secrets
    # directory; none is a job variable, and no token is in the job spec.
    for name in ("control", "batch", "read"):
        data = rendered[f"/secrets/{name}.token"]["data"]
        wanted = '{{ with nomadVar "nomad/jobs/gpugate" }}{{ .NAME_token }}{{ end }}\n'
        assert data == wanted.replace("NAME", name)
    variables = {name for v in job_file()["variable"] for name in v}
    assert variables == {"image"}
    assert "Bearer" not in NOMAD_JOB.read_text()
    assert "header" not in _keys(job_file())
    [batch] = loaded.config.identities
    assert batch.tokens == ("token-of-batch.token",)


def test_nomad_fronts_the_runtimes_the_kubernetes_pod_runs_as_the_chart_does(tmp_path):
    """The same budget, control and store; the runtimes both front, with the same class,
    residency and process matching (Nomad's are host services, the chart's are containers
    of the gated pod, so the models the router names are the chart's alone)."""
    nomad = _loaded(tmp_path).config
    kubernetes = load_config_text_with_warnings(configmap_text(), tmp_path / "k.yaml").config
    assert nomad.budget == kubernetes.budget
    assert nomad.gate.control == kubernetes.gate.control
    assert nomad.gate.database == kubernetes.gate.database
    ours = {c.name: c for c in nomad.consumers}
    shared = [c for c in kubernetes.consumers if c.name in ours]
    assert [c.name for c in shared] == [c.name for c in kubernetes.consumers]
    for theirs in shared:
        mine = ours[theirs.name]
        assert (mine.runtime, mine.listen, mine.upstream) == (
            theirs.runtime,
            theirs.listen,
            theirs.upstream,
        )
        assert mine.priority == theirs.priority and mine.residency == theirs.residency
        assert mine.processes == theirs.processes


def test_the_state_is_a_host_volume_where_the_config_keeps_its_database(tmp_path):
    [volume] = group()["volume"]
    assert volume == {"state": {"type": "host", "source": "gpugate-state", "read_only": False}}
    [mount] = task()["volume_mount"]
    config = _loaded(tmp_path).config
    assert mount == {"volume": "state", "destination": posixpath.dirname(str(config.gate.database))}


def test_the_kill_timeout_covers_the_shutdown_grace_within_the_clients_default_limit(tmp_path):
    config = _loaded(tmp_path).config
    seconds = int(re.fullmatch(r"(\d+)s", task()["kill_timeout"]).group(1))
    # A client refuses more than its max_kill_timeout, 30s unless raised.
    assert config.gate.shutdown_grace < seconds <= 30
    assert task()["kill_signal"] == "SIGTERM"


def test_the_static_ports_are_the_configs_listeners_and_each_has_a_checked_service(tmp_path):
    config = _loaded(tmp_path).config
    [network] = group()["network"]
    ports = {name: body["static"] for p in network["port"] for name, body in p.items()}
    wanted = {c.listen.port for c in config.consumers} | {config.gate.control.port}
    assert set(ports.values()) == wanted
    services = {s["name"]: s for s in group()["service"]}
    for consumer in config.consumers:
        service = services[f"gpugate-{consumer.name}"]
        assert ports[service["port"]] == consumer.listen.port
        assert service["provider"] == "nomad"
        [check] = service["check"]
        assert check["type"] in ("tcp", "http") and check["interval"] and check["timeout"]
    control = services["gpugate-control"]
    assert ports[control["port"]] == config.gate.control.port
    # Nomad's own checks are HTTP or TCP, and an HTTP check's header would put the read
    # token in the job: the control port is checked over TCP.
    [check] = control["check"]
    assert check["type"] == "tcp"
    assert "metrics" in control["tags"]
    assert len(services) == len(config.consumers) + 1
