"""The Kubernetes manifests in gpugate/share/deploy/kubernetes/ (the chart rendered with its
defaults) validate against Kubernetes' own schemas (kubernetes-validate, strict: an unknown field is
an error) and the ServiceMonitor against the prometheus-operator CRD's schema, and they say
what the design needs: one pod per GPU node that claims every card of the node and runs the
runtimes beside the gate on the pod's loopback; the node's PIDs; a configuration that
passes `gpugate check`; its tokens and state; probes on a real route; and Services through
which a client on any node reaches a gate."""

from __future__ import annotations

import posixpath
import re
import tomllib
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
    ROOT,
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
    runtime_containers,
    strict_servicemonitor_schema,
    token_files,
)

KUBERNETES_VERSIONS = ("1.34.0", "1.37.0")
"""The oldest release the manifests are written for (resource.k8s.io/v1, Dynamic Resource
Allocation, is GA there) and the newest kubernetes-validate knows."""

DOCUMENTS = list(all_documents())


def _id(item: tuple[Path, dict[str, Any]]) -> str:
    path, document = item
    return f"{path.name}:{document['kind']}/{document['metadata']['name']}"


def _config():
    return load_config_text_with_warnings(configmap_text(), Path("/nonexistent/c.yaml")).config


def test_the_manifests_are_there():
    kinds = sorted(d["kind"] for _, d in DOCUMENTS)
    assert kinds == sorted(
        ["Namespace", "ConfigMap", "ConfigMap", "ResourceClaimTemplate", "NetworkPolicy"]
        + ["Service"] * 4
        + ["DaemonSet", "Deployment", "PodDisruptionBudget", "ServiceMonitor"]
    ), kinds
    assert [p.name for p in manifest_files()] == ["gpugate.yaml", "servicemonitor.yaml"]


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


def test_the_claim_needs_the_release_where_dra_is_ga():
    """Before 1.34 there is no resource.k8s.io/v1: the chart says so (kubeVersion)."""
    template = only("ResourceClaimTemplate")
    with pytest.raises(SchemaNotFoundError):
        kubernetes_validate.validate(template, "1.33.0", strict=True)


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
    # hostPID and hostPath are refused below the "privileged" level.
    assert namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "privileged"
    for _, document in DOCUMENTS:
        if document["kind"] != "Namespace":
            assert document["metadata"]["namespace"] == name, _id((_, document))


# -- The gated pod: the node's cards and PIDs -------------------------------------------------


def test_the_gated_pod_shares_the_nodes_pids_and_keeps_its_own_network():
    spec = pod_spec()
    assert spec["hostPID"] is True
    # The pod's own network: its loopback is the runtimes', reached by the gate alone.
    assert "hostNetwork" not in spec
    for container in spec["containers"]:
        assert all("hostPort" not in p for p in container.get("ports", [])), container["name"]
    # Never two gated pods on a node: the first holds every card.
    assert daemonset()["spec"]["updateStrategy"]["rollingUpdate"]["maxSurge"] == 0
    assert spec["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in spec[
        "tolerations"
    ]


def test_the_pod_claims_every_card_of_its_node_and_every_container_shares_the_claim():
    template = only("ResourceClaimTemplate")
    [request] = template["spec"]["spec"]["devices"]["requests"]
    assert request["exactly"] == {"deviceClassName": "gpu.nvidia.com", "allocationMode": "All"}
    [claim] = pod_spec()["resourceClaims"]
    assert claim == {"name": "gpus", "resourceClaimTemplateName": template["metadata"]["name"]}
    containers = pod_spec()["containers"]
    assert len(containers) == 1 + len(runtime_containers()) >= 3
    for container in containers:
        resources = container["resources"]
        assert resources["claims"] == [{"name": "gpus"}], container["name"]
        # No card outside the claim: none from the device plugin, none by the NVIDIA
        # runtime's variable, which Kubernetes would not count.
        for kind in ("requests", "limits"):
            assert not [n for n in resources.get(kind, {}) if n.startswith("nvidia.com/")]
        assert "NVIDIA_VISIBLE_DEVICES" not in {e["name"] for e in container.get("env", [])}
    assert "runtimeClassName" not in pod_spec()
    assert {"cpu", "memory"} <= set(gate_container()["resources"]["requests"])


def test_each_runtime_listens_where_its_consumer_forwards_and_runs_as_its_processes_say():
    config = _config()
    containers = runtime_containers()
    assert sorted(containers) == sorted(c.name for c in config.consumers)
    for consumer in config.consumers:
        container = containers[consumer.name]
        env = {e["name"]: e["value"] for e in container.get("env", [])}
        command = " ".join(container["command"])
        upstream = (consumer.upstream.host, consumer.upstream.port)
        assert upstream[0] == "127.0.0.1"
        if consumer.runtime == "ollama":
            host, _, port = env["OLLAMA_HOST"].rpartition(":")
            assert (host, int(port)) == upstream
        else:
            [(host, port)] = re.findall(r"--listen (\S+) --port (\d+)", command)
            assert (host, int(port)) == upstream
        # The gate finds the runtime's processes by this command line.
        assert consumer.processes.commands, consumer.name
        assert all(c in command for c in consumer.processes.commands), (consumer.name, command)


def test_the_gate_and_the_runtimes_run_unprivileged_and_only_the_state_step_as_root():
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
    for name, container in runtime_containers().items():
        context = container["securityContext"]
        assert context["runAsUser"] not in (0, uid), name
        assert context["allowPrivilegeEscalation"] is False
        assert context["readOnlyRootFilesystem"] is True
        assert context["capabilities"] == {"drop": ["ALL"]}

    [init] = spec["initContainers"]
    root = init["securityContext"]
    assert root["runAsUser"] == 0 and root["runAsNonRoot"] is False
    assert root["capabilities"]["drop"] == ["ALL"]
    assert set(root["capabilities"]["add"]) <= {"CHOWN", "FOWNER"}
    assert root["readOnlyRootFilesystem"] is True
    script = " ".join(init["command"])
    assert f"chown {uid}:{gid} /var/lib/gpugate" in script
    # Each runtime's storage is given to the runtimes' user.
    mounts = {m["name"]: m["mountPath"] for m in init["volumeMounts"]}
    for name, container in runtime_containers().items():
        user = container["securityContext"]["runAsUser"]
        group = container["securityContext"]["runAsGroup"]
        assert f"chown {user}:{group} {mounts[f'{name}-storage']}" in script


def test_the_state_directory_is_on_the_node_where_the_config_keeps_its_database():
    config = _config()
    volumes = {v["name"]: v for v in pod_spec()["volumes"]}
    mounts = {m["mountPath"]: m["name"] for m in gate_container()["volumeMounts"]}
    directory = posixpath.dirname(str(config.gate.database))
    assert volumes[mounts[directory]]["hostPath"] == {
        "path": "/var/lib/gpugate",
        "type": "DirectoryOrCreate",
    }


def test_the_grace_period_covers_the_gates_shutdown_grace():
    config = _config()
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
    assert "ok — 2 consumers (comfyui, ollama)" in done.stdout
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
    [volume] = [v for v in pod_spec()["volumes"] if v["name"] == "etc"]
    assert volume["projected"]["defaultMode"] == 0o440
    # Only the gate's container sees the tokens.
    for container in runtime_containers().values():
        assert "etc" not in {m["name"] for m in container["volumeMounts"]}


def test_the_servicemonitor_presents_the_read_token_the_probes_use():
    _, files = _projected()
    read = files["/etc/gpugate/tokens/read.token"]
    [endpoint] = only("ServiceMonitor")["spec"]["endpoints"]
    credentials = endpoint["authorization"]["credentials"]
    assert ("secret", credentials["name"], credentials["key"]) == read
    assert endpoint["authorization"]["type"] == "Bearer"
    assert read[1] != files["/etc/gpugate/tokens/control.token"][1]


# -- Ports and Services ---------------------------------------------------------------------


def _gate_ports() -> dict[str, int]:
    return {p["name"]: p["containerPort"] for p in gate_container()["ports"]}


def test_the_container_ports_are_the_configs_listeners_control_and_agent():
    config = _config()
    ports = _gate_ports()
    assert {ports[c.name] for c in config.consumers} == {c.listen.port for c in config.consumers}
    assert ports["control"] == config.gate.control.port
    assert config.gate.agent_check is not None
    assert ports["agent"] == config.gate.agent_check.port
    assert len(ports) == len(config.consumers) + 2
    assert {c.listen.host for c in config.consumers} == {"0.0.0.0"}


def _selects(service: dict[str, Any], component: str) -> bool:
    return service["spec"]["selector"].get("app.kubernetes.io/component") == component


def test_no_service_keeps_traffic_on_the_clients_node():
    """internalTrafficPolicy: Local dropped every request from a node without a gate."""
    for service in of_kind("Service"):
        assert service["spec"].get("internalTrafficPolicy", "Cluster") == "Cluster"
        assert service["spec"].get("externalTrafficPolicy", "Cluster") == "Cluster"


def test_each_runtime_has_a_service_through_the_router_or_to_every_gated_pod():
    config = _config()
    pod_labels = daemonset()["spec"]["template"]["metadata"]["labels"]
    router = only("Deployment", "gpugate-router")
    router_labels = router["spec"]["template"]["metadata"]["labels"]
    [haproxy] = router["spec"]["template"]["spec"]["containers"]
    router_ports = {p["name"]: p["containerPort"] for p in haproxy["ports"]}
    for consumer in config.consumers:
        service = only("Service", f"gpugate-{consumer.name}")
        [port] = service["spec"]["ports"]
        assert port["port"] == consumer.listen.port
        if consumer.runtime == "ollama":
            # Routed by model: the router's pods, on the same port.
            assert service["spec"]["selector"].items() <= router_labels.items()
            assert router_ports[port["targetPort"]] == consumer.listen.port
        else:
            assert service["spec"]["selector"].items() <= pod_labels.items()
            assert _gate_ports()[port["targetPort"]] == consumer.listen.port
    # ComfyUI keeps a client's queue, history and outputs in the server it asked.
    assert only("Service", "gpugate-comfyui")["spec"]["sessionAffinity"] == "ClientIP"


def test_the_headless_gates_service_publishes_each_runtime_port_and_the_agent():
    gates = only("Service", "gpugate-gates")
    assert gates["spec"]["clusterIP"] == "None"
    assert not gates["spec"].get("publishNotReadyAddresses", False)
    assert _selects(gates, "gate")
    ports = {p["name"]: p for p in gates["spec"]["ports"]}
    for name, number in _gate_ports().items():
        if name != "control":
            assert ports[name]["port"] == number and ports[name]["targetPort"] == name


def test_only_the_router_reaches_the_agent_port():
    policy = only("NetworkPolicy")
    pod_labels = daemonset()["spec"]["template"]["metadata"]["labels"]
    router_labels = only("Deployment")["spec"]["template"]["metadata"]["labels"]
    assert policy["spec"]["podSelector"]["matchLabels"].items() <= pod_labels.items()
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    open_to_all, from_router = policy["spec"]["ingress"]
    ports = _gate_ports()
    assert "from" not in open_to_all
    assert {p["port"] for p in open_to_all["ports"]} == {
        n for name, n in ports.items() if name != "agent"
    }
    [peer] = from_router["from"]
    assert peer["podSelector"]["matchLabels"].items() <= router_labels.items()
    assert not peer["podSelector"]["matchLabels"].items() <= pod_labels.items()
    assert [p["port"] for p in from_router["ports"]] == [ports["agent"]]


def test_the_servicemonitor_scrapes_metrics_on_the_control_service():
    control = only("Service", "gpugate-control")
    monitor = only("ServiceMonitor")
    selector = monitor["spec"]["selector"]["matchLabels"]
    assert selector.items() <= control["metadata"]["labels"].items()
    for service in of_kind("Service"):
        if service is not control:
            assert not selector.items() <= service["metadata"]["labels"].items()
    [endpoint] = monitor["spec"]["endpoints"]
    [port] = control["spec"]["ports"]
    assert endpoint["port"] == port["name"] == "control"
    assert port["port"] == _config().gate.control.port
    assert endpoint["path"] == "/metrics"
    assert control["spec"]["clusterIP"] == "None"
    assert control["spec"]["publishNotReadyAddresses"] is True


# -- Probes and image -----------------------------------------------------------------------


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
    assert url == f"http://127.0.0.1:{_config().gate.control.port}/gate/v1/health"
    assert "/gate/v1/health" in openapi_document()["paths"]
    _, files = _projected()
    assert files[token] == ("secret", "gpugate-read-token", "token")


def test_the_containerfile_builds_the_image_the_gate_runs():
    instructions = containerfile()
    assert instructions["FROM"] == ["python:3.11-slim"]
    uid, gid = image_uid_gid()
    assert uid != 0 and gid != 0
    assert any(f"--uid {uid}" in run for run in instructions["RUN"])
    assert image_entrypoint() == ["gpugate", "serve", "--config", "/etc/gpugate/consumers.yaml"]
    copied = [c.split()[:-1] for c in instructions["COPY"]]
    # What the wheel is built from: pyproject's top-level packages, and the files it reads.
    include = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"][
        "packages"
    ]["find"]["include"]
    packages = sorted(name for name in include if "." not in name)
    assert packages == ["gpugate", "gpugate_sim"]
    assert sorted(name for names in copied for name in names) == sorted(
        ["README.md", "pyproject.toml", *packages]
    )
    [init] = pod_spec()["initContainers"]
    assert init["image"] == gate_container()["image"]
