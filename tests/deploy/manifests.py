"""The shipped deployment files, read as the tests need them: gpugate/share/deploy/kubernetes/
is the Helm chart gpugate/share/deploy/helm/gpugate rendered with its defaults
(tests/deploy/chart.py)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "gpugate" / "share" / "deploy"
KUBERNETES = DEPLOY / "kubernetes"
NOMAD_JOB = DEPLOY / "nomad" / "gpugate.nomad.hcl"
CONTAINERFILE = DEPLOY / "Containerfile"
SERVICEMONITOR_SCHEMA = Path(__file__).with_name("servicemonitor-v1.schema.json")


def manifest_files() -> list[Path]:
    """The manifests (the kustomization names them; it is no Kubernetes object)."""
    return sorted(p for p in KUBERNETES.glob("*.yaml") if p.name != "kustomization.yaml")


@cache
def documents(path: Path) -> tuple[dict[str, Any], ...]:
    """Every object of a manifest file, as kubectl reads it (anchors resolved)."""
    return tuple(d for d in yaml.safe_load_all(path.read_text()) if d)


def all_documents() -> Iterator[tuple[Path, dict[str, Any]]]:
    for path in manifest_files():
        for document in documents(path):
            yield path, document


def only(kind: str, name: str | None = None) -> dict[str, Any]:
    found = [
        d
        for _, d in all_documents()
        if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)
    ]
    assert len(found) == 1, f"{len(found)} {kind} objects named {name}"
    return found[0]


def of_kind(kind: str) -> list[dict[str, Any]]:
    return [d for _, d in all_documents() if d["kind"] == kind]


def daemonset() -> dict[str, Any]:
    return only("DaemonSet", "gpugate")


def pod_spec() -> dict[str, Any]:
    return daemonset()["spec"]["template"]["spec"]


def gate_container() -> dict[str, Any]:
    [container] = [c for c in pod_spec()["containers"] if c["name"] == "gpugate"]
    return container


def runtime_containers() -> dict[str, dict[str, Any]]:
    """The runtimes' containers of the gated pod, by name."""
    return {c["name"]: c for c in pod_spec()["containers"] if c["name"] != "gpugate"}


def configmap_text() -> str:
    return only("ConfigMap", "gpugate-config")["data"]["consumers.yaml"]


def router_files() -> dict[str, str]:
    """The router's haproxy.cfg and map files, as its ConfigMap holds them."""
    return dict(only("ConfigMap", "gpugate-router")["data"])


def strict_servicemonitor_schema() -> dict[str, Any]:
    """The vendored CRD schema, with unknown fields refused as the API server refuses them
    under strict field validation (kubectl's default): every object schema that lists its
    properties and says nothing else about the others admits no others."""

    def strict(node: Any) -> Any:
        if isinstance(node, dict):
            node = {k: strict(v) for k, v in node.items()}
            if (
                "properties" in node
                and "additionalProperties" not in node
                and not node.get("x-kubernetes-preserve-unknown-fields")
            ):
                node["additionalProperties"] = False
            return node
        if isinstance(node, list):
            return [strict(v) for v in node]
        return node

    schema = json.loads(SERVICEMONITOR_SCHEMA.read_text())
    schema.pop("$comment", None)
    return strict(schema)


def gpugate_check(text: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    """`gpugate check` on configuration text, as an operator runs it."""
    path = tmp_path / "consumers.yaml"
    path.write_text(text)
    return subprocess.run(
        [sys.executable, "-m", "gpugate", "check", str(path)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        check=False,
        timeout=60,
    )


def token_files(text: str) -> list[str]:
    """The paths of every `file:` token a configuration names."""
    return re.findall(r"file:(/[^\s\"'\]},]+)", text)


def containerfile() -> dict[str, list[str]]:
    """Each instruction of the Containerfile with its arguments (continuations joined)."""
    instructions: dict[str, list[str]] = {}
    logical = re.sub(r"\\\n", " ", CONTAINERFILE.read_text())
    for line in logical.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        word, _, rest = line.partition(" ")
        instructions.setdefault(word.upper(), []).append(rest.strip())
    return instructions


def image_uid_gid() -> tuple[int, int]:
    [user] = containerfile()["USER"]
    uid, _, gid = user.partition(":")
    return int(uid), int(gid)


def image_entrypoint() -> list[str]:
    [entrypoint] = containerfile()["ENTRYPOINT"]
    return json.loads(entrypoint)
