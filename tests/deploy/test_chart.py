"""The Helm chart gpugate/share/deploy/helm/gpugate, rendered by Helm's own engine
(tests/deploy/chart.py): `helm lint --strict` passes; gpugate/share/deploy/kubernetes/ is
exactly what it renders with its defaults; its other shapes (the device plugin instead of
DRA, a runtime turned off) render manifests that validate strictly; and the router's HAProxy
configuration is accepted by Debian's HAProxy and routes every model the gates front."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from gpugate.runtimes.sections import load_config_text_with_warnings
from tests.deploy import chart
from tests.deploy.manifests import configmap_text, only, router_files
from tests.scaleout.hosts import haproxy_binary

VERSIONS = ("1.34.0", "1.37.0")


def documents(rendered: dict[str, str]) -> list[dict[str, Any]]:
    return [d for text in rendered.values() for d in yaml.safe_load_all(text) if d]


def kinds(rendered: dict[str, str]) -> dict[tuple[str, str], dict[str, Any]]:
    return {(d["kind"], d["metadata"]["name"]): d for d in documents(rendered)}


def test_the_plain_manifests_are_the_charts_output():
    for name, text in chart.plain_files().items():
        assert (chart.PLAIN / name).read_text() == text, f"{name}: run `make manifests`"
    assert sorted(p.name for p in chart.PLAIN.iterdir()) == sorted(chart.plain_files())


@pytest.mark.parametrize(
    "values", [{}, {"gpus": {"claim": "devicePlugin", "count": 2}}], ids=["dra", "devicePlugin"]
)
def test_helm_lint_strict_passes(values):
    report = chart.lint(values)
    assert report["errors"] == []
    assert [m for m in report["messages"] if m["severity"] >= 2] == [], report["messages"]


def test_helm_lint_fails_a_broken_chart(tmp_path):
    """The lint above can fail: a template that does not parse is an error."""
    broken = tmp_path / "gpugate"
    shutil.copytree(chart.CHART, broken)
    (broken / "templates" / "services.yaml").write_text("{{ if }}\n")
    report = chart.helm.lint(str(broken), strict=True)
    assert report["errors"] or [m for m in report["messages"] if m["severity"] >= 3]


@pytest.mark.parametrize("version", VERSIONS)
def test_with_the_device_plugin_the_gate_asks_for_every_card_and_shares_them(version):
    rendered = chart.render({"gpus": {"claim": "devicePlugin", "count": 2}})
    objects = kinds(rendered)
    for document in objects.values():
        assert kubernetes_validate.validate(document, version, strict=True)
    assert not [k for k in objects if k[0] == "ResourceClaimTemplate"]
    spec = objects[("DaemonSet", "gpugate")]["spec"]["template"]["spec"]
    assert spec["runtimeClassName"] == "nvidia" and "resourceClaims" not in spec
    gate, *runtimes = spec["containers"]
    assert gate["name"] == "gpugate"
    assert gate["resources"]["limits"]["nvidia.com/gpu"] == 2
    for container in runtimes:
        env = {e["name"]: e["value"] for e in container["env"]}
        assert env["NVIDIA_VISIBLE_DEVICES"] == "all", container["name"]
        assert "claims" not in container["resources"]
        assert not [n for n in container["resources"].get("limits", {}) if "nvidia" in n]


def test_without_a_runtime_routed_by_model_there_is_no_router(tmp_path):
    rendered = chart.render({"runtimes": {"ollama": {"enabled": False}}})
    objects = kinds(rendered)
    assert not [k for k in objects if "router" in k[1]]
    assert ("Service", "gpugate-ollama") not in objects
    spec = objects[("DaemonSet", "gpugate")]["spec"]["template"]["spec"]
    assert [c["name"] for c in spec["containers"]] == ["gpugate", "comfyui"]
    text = objects[("ConfigMap", "gpugate-config")]["data"]["consumers.yaml"]
    config = load_config_text_with_warnings(text, tmp_path / "c.yaml").config
    assert [c.name for c in config.consumers] == ["comfyui"]
    for document in objects.values():
        assert kubernetes_validate.validate(document, VERSIONS[0], strict=True)


# -- The router ------------------------------------------------------------------------------


def test_haproxy_accepts_the_routers_configuration(tmp_path):
    binary, env = haproxy_binary()
    files = router_files()
    mount = "/usr/local/etc/haproxy/"
    for name, text in files.items():
        (tmp_path / name).write_text(text.replace(mount, f"{tmp_path}/"))
    checked = subprocess.run(
        [str(binary), "-c", "-f", str(tmp_path / "haproxy.cfg")],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "Configuration file is valid" in checked.stdout
    # And it would refuse a wrong one: a backend the frontend names that does not exist.
    (tmp_path / "haproxy.cfg").write_text(
        (tmp_path / "haproxy.cfg")
        .read_text()
        .replace("default_backend ollama_any", "default_backend nowhere")
    )
    refused = subprocess.run(
        [str(binary), "-c", "-f", str(tmp_path / "haproxy.cfg")],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert refused.returncode != 0


def test_the_router_has_a_backend_for_every_model_the_gates_front(tmp_path):
    config = load_config_text_with_warnings(configmap_text(), tmp_path / "c.yaml").config
    [ollama] = [c for c in config.consumers if c.runtime == "ollama"]
    files = router_files()
    cfg = files["haproxy.cfg"]
    mapping = dict(line.split() for line in files["ollama.map"].splitlines())
    backends = set(re.findall(r"^\s*backend (\S+)", cfg, re.M))
    assert set(mapping.values()) <= backends
    models = {model.name for model in ollama.models}
    assert models and models <= set(mapping)
    assert mapping["bge-m3"] == mapping["bge-m3:latest"]
    for model in models:
        block = cfg.split(f"backend {mapping[model]}\n", 1)[1].split("\n\n", 1)[0]
        # Each slot's agent asks that gate about this model, of this consumer.
        assert f'agent-send "{model} consumer=ollama\\n"' in block
        assert "backup" in block and "option allbackups" in block


def test_the_router_finds_the_gates_through_the_headless_services_srv_records():
    files = router_files()
    cfg = files["haproxy.cfg"]
    names = set(re.findall(r"server-template \S+ \d+-\d+ (\S+)", cfg))
    gates = only("Service", "gpugate-gates")
    [ollama] = [p for p in gates["spec"]["ports"] if p["name"] == "ollama"]
    service, namespace = gates["metadata"]["name"], gates["metadata"]["namespace"]
    assert names == {f"_{ollama['name']}._tcp.{service}.{namespace}.svc.cluster.local"}
    # The agent port the router asks is the gate's agent_check port.
    config = load_config_text_with_warnings(configmap_text(), Path("/nonexistent/c.yaml")).config
    assert config.gate.agent_check is not None
    assert f"agent-port {config.gate.agent_check.port} " in cfg
    assert "resolvers cluster" in cfg and "parse-resolv-conf" in cfg
