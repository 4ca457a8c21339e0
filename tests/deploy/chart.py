"""The Helm chart in gpugate/share/deploy/helm/gpugate, rendered by Helm's own engine
(helm.sh/helm/v4's `engine` and `action` packages, which the helm-python-sdk wheel carries
compiled as libhelm_c), and the plain manifests of gpugate/share/deploy/kubernetes/ made
from it.

    python -m tests.deploy.chart --write    # deploy/kubernetes/ from the chart (make manifests)
    python -m tests.deploy.chart --check    # exit 1 if they differ from the chart's output
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import helm_python as helm

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "gpugate" / "share" / "deploy" / "helm" / "gpugate"
PLAIN = ROOT / "gpugate" / "share" / "deploy" / "kubernetes"
RELEASE = "gpugate"
NAMESPACE = "gpugate"
PLAIN_VALUES: dict[str, Any] = {"namespace": {"create": True}, "serviceMonitor": {"enabled": True}}
"""The plain manifests: the chart's defaults, with the namespace and the ServiceMonitor."""
ORDER = (
    "namespace",
    "configmap",
    "router-config",
    "resourceclaimtemplate",
    "networkpolicy",
    "services",
    "daemonset",
    "router",
    "servicemonitor",
)
"""The order kubectl applies them in: what a pod mounts or claims before the pod."""
SEPARATE = ("servicemonitor",)
"""Templates written to a file of their own, outside the kustomization: a ServiceMonitor
needs the Prometheus Operator's CRDs."""
HEADER = (
    "# Rendered from gpugate/share/deploy/helm/gpugate by `make manifests`, as\n"
    "#     helm template gpugate gpugate/share/deploy/helm/gpugate --namespace gpugate "
    "--set namespace.create=true{extra}\n"
    "# Edit the chart (or its values) and render again rather than editing this file.\n"
)


def render(values: dict[str, Any] | None = None) -> dict[str, str]:
    """Each template's output (by its name, without directory or .yaml), empty ones left
    out, as `helm template` prints them."""
    with helm.Chart.load(str(CHART)) as chart:
        rendered = chart.render(values or {}, name=RELEASE, namespace=NAMESPACE)
    out = {}
    for path, text in rendered.items():
        name = Path(path).name.removesuffix(".yaml")
        if path.endswith(".yaml") and text.strip():
            out[name] = text.strip() + "\n"
    unknown = set(out) - set(ORDER)
    assert not unknown, f"templates with no place in ORDER: {unknown}"
    return out


def lint(values: dict[str, Any] | None = None, kube_version: str = "v1.34.0") -> dict[str, Any]:
    """`helm lint --strict` of the chart."""
    return helm.lint(
        str(CHART), values, strict=True, namespace=NAMESPACE, kube_version=kube_version
    )


def plain_files() -> dict[str, str]:
    """gpugate/share/deploy/kubernetes/: file name → text."""
    rendered = render(PLAIN_VALUES)

    def join(names: list[str], extra: str) -> str:
        parts = [HEADER.format(extra=extra)]
        for name in names:
            parts.append(f"---\n# Source: gpugate/templates/{name}.yaml\n{rendered[name]}")
        return "".join(parts)

    main = [n for n in ORDER if n in rendered and n not in SEPARATE]
    files = {"gpugate.yaml": join(main, "")}
    for name in SEPARATE:
        files[f"{name}.yaml"] = join([name], f" \\\n#         --set {name_value(name)}=true")
    files["kustomization.yaml"] = (
        "# kubectl apply -k gpugate/share/deploy/kubernetes/ (make the two token Secrets\n"
        "# first: see docs/scale-out.md). servicemonitor.yaml needs the Prometheus\n"
        "# Operator's CRDs: apply it on its own where they are installed.\n"
        "apiVersion: kustomize.config.k8s.io/v1beta1\n"
        "kind: Kustomization\n"
        "resources:\n"
        "  - gpugate.yaml\n"
    )
    return files


def name_value(template: str) -> str:
    return {"servicemonitor": "serviceMonitor.enabled"}[template]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument(
        "--write", action="store_true", help="write gpugate/share/deploy/kubernetes/"
    )
    args = parser.parse_args(argv)
    files = plain_files()
    stale = [name for name, text in files.items() if not (PLAIN / name).exists()
             or (PLAIN / name).read_text() != text]  # fmt: skip
    if args.write:
        PLAIN.mkdir(parents=True, exist_ok=True)
        for name in stale:
            (PLAIN / name).write_text(files[name])
            print(f"wrote {PLAIN.relative_to(ROOT)}/{name}")
        return 0
    for name in stale:
        print(f"{PLAIN.relative_to(ROOT)}/{name} differs from the chart's output: make manifests")
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main())
