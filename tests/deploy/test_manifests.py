"""The Kubernetes manifests in deploy/kubernetes/ validate against Kubernetes' own schemas
(kubernetes-validate, strict: an unknown field is an error) and the ServiceMonitor against
the prometheus-operator CRD's schema, and they say what the gate needs: the node's network
and PIDs, every card through the NVIDIA runtime without taking one from the device
plugin, its configuration (which passes `gpugate check`), its tokens, its state, and
probes on a real route."""

from __future__ import annotations

import posixpath
import re
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
from kubernetes_validate.utils import SchemaNotFoundError

from gpugate.config.model import Scope, token_scopes
from gpugate.control.openapi import openapi_document
from gpugate.runtimes.sections import load_config_text_with_warnings
from tests.deploy.manifests import (
    all_documents,
    configmap_text,
    containerfile,
    daemonset,
    gate_container,
    gpugate_check,
    image_entrypoint,
    image_uid_gid,
    manifest_files,
    of_kind,
    only,
    pod_spec,
    strict_servicemonitor_schema,
    token_files,
)

KUBERNETES_VERSIONS = ("1.30.0", "1.37.0")
"""The oldest release the manifests are written for (every field they use is GA there)
and the newest kubernetes-validate knows."""

DOCUMENTS = list(all_documents())


def _id(item: tuple[Path, dict[str, Any]]) -> str:
    path, document = item
    return f"{path.name}:{document['kind']}/{document['metadata']['name']}"


def test_the_manifests_are_there():
    kinds = sorted(d["kind"] for _, d in DOCUMENTS)
    assert kinds == sorted(
        ["Namespace", "ConfigMap", "DaemonSet", "ServiceMonitor"] + ["Service"] * 5
    ), kinds
    assert all(p.suffix == ".yaml" for p in manifest_files())


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
@pytest.mark.parametrize("item", DOCUMENTS, ids=[_id(d) for d in DOCUMENTS])
def test_every_manifest_validates_against_its_schema(item, version):
    _, document = item
    if document["apiVersion"] == "monitoring.coreos.com/v1":
        # A CRD's kind is in no Kubernetes schema: its own CRD's schema, and ObjectMeta's.
        with pytest.raises(SchemaNotFoundError):
            kubernetes_validate.validate(document, version, strict=True)
        jsonschema.validate(document, strict_servicemonitor_schema())
        return
    assert kubernetes_validate.validate(document, version, strict=True)


def test_the_validators_refuse_an_unknown_field():
    """The checks above can fail: a misspelt field is an error, not a field ignored."""
    broken = daemonset() | {}
    broken["spec"] = broken["spec"] | {"template": {**broken["spec"]["template"]}}
    broken["spec"]["template"]["spec"] = pod_spec() | {"hostPid": True}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, KUBERNETES_VERSIONS[0], strict=True)

    monitor = only("ServiceMonitor")
    endpoint = monitor["spec"]["endpoints"][0] | {"bearerTokenSecrets": {}}
    bad = monitor | {"spec": monitor["spec"] | {"endpoints": [endpoint]}}
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(bad, strict_servicemonitor_schema())


def test_every_namespaced_object_is_in_the_gates_namespace():
    [namespace] = of_kind("Namespace")
    name = namespace["metadata"]["name"]
    # hostNetwork, hostPID and hostPath are all refused below the "privileged" level.
    assert namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "privileged"
    for _, document in DOCUMENTS:
        if document["kind"] != "Namespace":
            assert document["metadata"]["namespace"] == name, _id((_, document))


# -- The DaemonSet --------------------------------------------------------------------------


def test_the_gate_shares_the_nodes_network_and_pids():
    spec = pod_spec()
    assert spec["hostNetwork"] is True
    assert spec["hostPID"] is True
    assert spec["dnsPolicy"] == "ClusterFirstWithHostNet"
    # Never two gates on a node: the second could not bind the ports.
    assert daemonset()["spec"]["updateStrategy"]["rollingUpdate"]["maxSurge"] == 0


def test_the_gate_sees_every_card_through_the_nvidia_runtime_for_nvml_only():
    spec = pod_spec()
    assert spec["runtimeClassName"] == "nvidia"
    env = {e["name"]: e["value"] for e in gate_container()["env"]}
    assert env["NVIDIA_VISIBLE_DEVICES"] == "all"
    assert env["NVIDIA_DRIVER_CAPABILITIES"] == "utility"
    assert spec["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in spec[
        "tolerations"
    ]


def test_no_container_takes_a_gpu_from_the_device_plugin():
    spec = pod_spec()
    for container in spec["containers"] + spec.get("initContainers", []):
        resources = container.get("resources", {})
        for kind in ("requests", "limits"):
            names = set(resources.get(kind, {}))
            assert not {n for n in names if n.startswith("nvidia.com/")}, (container["name"], kind)
    # It does ask for CPU and memory.
    assert {"cpu", "memory"} <= set(gate_container()["resources"]["requests"])


def test_the_gate_runs_unprivileged_and_only_the_state_step_as_root():
    spec = pod_spec()
    uid, gid = image_uid_gid()
    pod = spec["securityContext"]
    assert pod["runAsNonRoot"] is True
    assert (pod["runAsUser"], pod["runAsGroup"], pod["fsGroup"]) == (uid, gid, gid)
    assert pod["seccompProfile"] == {"type": "RuntimeDefault"}
    assert "privileged" not in str(spec["containers"])
    context = gate_container()["securityContext"]
    assert context["readOnlyRootFilesystem"] is True
    assert context["allowPrivilegeEscalation"] is False
    assert context["capabilities"] == {"drop": ["ALL"]}
    assert "runAsUser" not in context and "runAsNonRoot" not in context

    [init] = spec["initContainers"]
    root = init["securityContext"]
    assert root["runAsUser"] == 0 and root["runAsNonRoot"] is False
    assert root["capabilities"]["drop"] == ["ALL"]
    assert set(root["capabilities"]["add"]) <= {"CHOWN", "FOWNER"}
    assert root["readOnlyRootFilesystem"] is True
    assert f"chown {uid}:{gid} /var/lib/gpugate" in " ".join(init["command"])


def test_the_state_directory_is_on_the_node_where_the_config_keeps_its_database():
    config = _loaded_configmap(Path("/nonexistent")).config
    volumes = {v["name"]: v for v in pod_spec()["volumes"]}
    mounts = {m["mountPath"]: m["name"] for m in gate_container()["volumeMounts"]}
    directory = posixpath.dirname(str(config.gate.database))
    assert volumes[mounts[directory]]["hostPath"] == {
        "path": "/var/lib/gpugate",
        "type": "DirectoryOrCreate",
    }
    [init] = pod_spec()["initContainers"]
    assert {m["mountPath"] for m in init["volumeMounts"]} == {directory}


def test_the_grace_period_covers_the_gates_shutdown_grace():
    config = _loaded_configmap(Path("/nonexistent")).config
    assert pod_spec()["terminationGracePeriodSeconds"] > config.gate.shutdown_grace + 5


# -- Configuration and tokens -----------------------------------------------------------------


def _projected() -> tuple[str, dict[str, tuple[str, str, str]]]:
    """The projected volume's mount path, and each file in it: (kind, object, key)."""
    [mount] = [m for m in gate_container()["volumeMounts"] if m["name"] == "etc"]
    [volume] = [v for v in pod_spec()["volumes"] if v["name"] == "etc"]
    files: dict[str, tuple[str, str, str]] = {}
    for source in volume["projected"]["sources"]:
        [(kind, ref)] = source.items()
        for item in ref["items"]:
            files[posixpath.join(mount["mountPath"], item["path"])] = (
                kind,
                ref["name"],
                item["key"],
            )
    assert mount["readOnly"] is True
    return mount["mountPath"], files


def test_the_image_reads_the_configmaps_consumers_yaml():
    entrypoint = image_entrypoint()
    assert entrypoint[:2] == ["gpugate", "serve"]
    config_path = entrypoint[entrypoint.index("--config") + 1]
    assert "command" not in gate_container() and "args" not in gate_container()
    _, files = _projected()
    assert files[config_path] == ("configMap", "gpugate-config", "consumers.yaml")


def test_the_configmaps_consumers_yaml_passes_gpugate_check(tmp_path):
    done = gpugate_check(configmap_text(), tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "ok — 4 consumers (ollama, comfyui, whisper, vllm)" in done.stdout
    # Off the node, the token files are the only thing it cannot read.
    warnings = [line for line in done.stderr.splitlines() if line]
    assert warnings and all("token file /etc/gpugate/tokens/" in w for w in warnings), warnings


def _loaded_configmap(tokens: Path):
    """The ConfigMap's configuration, its token files read from `tokens`."""
    text = configmap_text().replace("file:/etc/gpugate/tokens/", f"file:{tokens}/")
    return load_config_text_with_warnings(text, tokens / "consumers.yaml")


def test_every_token_file_the_config_names_comes_from_a_secret(tmp_path):
    _, files = _projected()
    named = token_files(configmap_text())
    assert len(named) == 3
    for path in named:
        kind, _, _ = files[path]
        assert kind == "secret", path
    # Those files hold the control tokens and the batch identity's.
    for path in named:
        (tmp_path / posixpath.basename(path)).write_text(f"token-of-{posixpath.basename(path)}\n")
    loaded = _loaded_configmap(tmp_path)
    assert loaded.warnings == ()
    gate = loaded.config.gate
    assert gate.control_public is False
    scopes = {str(token): token_scopes(token) for token in gate.control_tokens}
    assert scopes == {
        "token-of-control.token": frozenset(Scope),
        "token-of-read.token": frozenset({Scope.READ}),
    }
    [batch] = loaded.config.identities
    assert batch.tokens == ("token-of-batch.token",)
    # The token files are readable by the gate's group only.
    [volume] = [v for v in pod_spec()["volumes"] if v["name"] == "etc"]
    assert volume["projected"]["defaultMode"] == 0o440


def test_the_servicemonitor_presents_the_read_token_the_probes_use():
    _, files = _projected()
    read = files["/etc/gpugate/tokens/read.token"]
    [endpoint] = only("ServiceMonitor")["spec"]["endpoints"]
    credentials = endpoint["authorization"]["credentials"]
    assert ("secret", credentials["name"], credentials["key"]) == read
    assert endpoint["authorization"]["type"] == "Bearer"
    # Prometheus never holds a token that can change anything.
    assert read[1] != files["/etc/gpugate/tokens/control.token"][1]


# -- Ports and Services ---------------------------------------------------------------------


def test_the_container_ports_are_the_configs_listeners_and_control_port():
    config = _loaded_configmap(Path("/nonexistent")).config
    ports = {p["containerPort"]: p for p in gate_container()["ports"]}
    wanted = {c.listen.port for c in config.consumers} | {config.gate.control.port}
    assert set(ports) == wanted
    for number, port in ports.items():
        assert port.get("hostPort", number) == number
        assert port["protocol"] == "TCP"
    # Every listener binds every address of the node, the control listener too.
    assert {c.listen.host for c in config.consumers} == {"0.0.0.0"}
    assert config.gate.control.host == "0.0.0.0"
    # ... and each runtime stays on the node's loopback, behind the gate.
    assert {c.upstream.host for c in config.consumers} == {"127.0.0.1"}


def test_each_runtime_port_has_a_service_that_stays_on_the_clients_node():
    config = _loaded_configmap(Path("/nonexistent")).config
    container_ports = {p["name"]: p["containerPort"] for p in gate_container()["ports"]}
    pod_labels = daemonset()["spec"]["template"]["metadata"]["labels"]
    runtime_services = [
        s
        for s in of_kind("Service")
        if s["metadata"]["labels"]["app.kubernetes.io/component"] == "runtime"
    ]
    served: dict[int, str] = {}
    for service in runtime_services:
        spec = service["spec"]
        assert spec["internalTrafficPolicy"] == "Local", service["metadata"]["name"]
        assert spec["selector"].items() <= pod_labels.items()
        [port] = spec["ports"]
        assert container_ports[port["targetPort"]] == port["port"]
        served[port["port"]] = service["metadata"]["name"]
    assert set(served) == {c.listen.port for c in config.consumers}
    for consumer in config.consumers:
        assert served[consumer.listen.port] == f"gpugate-{consumer.name}"


def test_the_servicemonitor_scrapes_metrics_on_the_control_service():
    control = only("Service", "gpugate-control")
    monitor = only("ServiceMonitor")
    assert (
        monitor["spec"]["selector"]["matchLabels"].items() <= control["metadata"]["labels"].items()
    )
    # Only the control Service: the runtime Services' labels do not match.
    for service in of_kind("Service"):
        if service is not control:
            assert not (
                monitor["spec"]["selector"]["matchLabels"].items()
                <= service["metadata"]["labels"].items()
            )
    [endpoint] = monitor["spec"]["endpoints"]
    [port] = control["spec"]["ports"]
    assert endpoint["port"] == port["name"] == "control"
    config = _loaded_configmap(Path("/nonexistent")).config
    assert port["port"] == config.gate.control.port
    assert endpoint["path"] == "/metrics"
    assert control["spec"]["clusterIP"] == "None"
    assert control["spec"]["publishNotReadyAddresses"] is True


# -- Probes ---------------------------------------------------------------------------------


def probe_script() -> str:
    container = gate_container()
    scripts = set()
    for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
        command = container[probe]["exec"]["command"]
        assert command[:2] == ["python3", "-c"]
        scripts.add(command[2])
    [script] = scripts
    return script


def test_the_probes_ask_the_control_apps_health_route_with_the_read_token():
    container = gate_container()
    modes = {p: container[p]["exec"]["command"][3] for p in ("startupProbe", "livenessProbe")}
    assert modes == {"startupProbe": "live", "livenessProbe": "live"}
    assert container["readinessProbe"]["exec"]["command"][3] == "ready"
    script = probe_script()
    [url] = re.findall(r'URL = "([^"]+)"', script)
    [token] = re.findall(r'TOKEN = "([^"]+)"', script)
    config = _loaded_configmap(Path("/nonexistent")).config
    assert url == f"http://127.0.0.1:{config.gate.control.port}/gate/v1/health"
    assert "/gate/v1/health" in openapi_document()["paths"]
    _, files = _projected()
    assert files[token] == ("secret", "gpugate-read-token", "token")


def test_the_containerfile_builds_the_image_the_manifests_run():
    instructions = containerfile()
    assert instructions["FROM"] == ["python:3.11-slim"]
    uid, gid = image_uid_gid()
    assert uid != 0 and gid != 0
    assert any(f"--uid {uid}" in run for run in instructions["RUN"])
    assert image_entrypoint() == ["gpugate", "serve", "--config", "/etc/gpugate/consumers.yaml"]
    # What it copies is the package, not the checkout (no .venv, no build/).
    copied = [c.split()[:-1] for c in instructions["COPY"]]
    assert sorted(name for names in copied for name in names) == [
        "README.md",
        "gpugate",
        "pyproject.toml",
    ]
    images = {c["image"] for c in pod_spec()["containers"] + pod_spec()["initContainers"]}
    assert len(images) == 1
