"""gpugate/share/deploy/Containerfile, checked as far as this machine can: no container engine
can build it here (the docker command is a client with no engine, and the base image is on
Docker Hub, which the machine cannot reach), so hadolint lints it, and its steps run outside
a container: what it copies is installed as its RUN installs it, and the installed package
runs the image's entrypoint command on the Kubernetes ConfigMap."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from tests.deploy.manifests import CONTAINERFILE, ROOT, configmap_text, containerfile

HADOLINT = Path(sys.executable).with_name("hadolint")


def hadolint(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(HADOLINT), "--no-color", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_hadolint_finds_nothing():
    done = hadolint(CONTAINERFILE)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout == ""


def test_hadolint_would_find_a_fault(tmp_path):
    """The lint above can fail: an unpinned apt-get install is a warning (DL3008)."""
    faulty = tmp_path / "Containerfile"
    faulty.write_text(CONTAINERFILE.read_text() + "RUN apt-get update && apt-get install -y curl\n")
    done = hadolint(faulty)
    assert done.returncode != 0
    assert "DL3008" in done.stdout


def test_what_it_copies_installs_and_runs_the_entrypoint(tmp_path):
    """The COPY lines' sources, installed as the RUN line installs them (pip, no build
    isolation here: nothing is downloaded), give a package whose `gpugate` runs: `check`
    on the ConfigMap's consumers.yaml passes with the package from that copy alone."""
    source = tmp_path / "src"
    source.mkdir()
    for copy in containerfile()["COPY"]:
        *names, destination = copy.split()
        assert destination.startswith("/src"), copy
        into = source / destination.removeprefix("/src").lstrip("/")
        for name in names:
            # Several sources go into a directory; one directory's contents become the target.
            origin = ROOT / name
            target = into / origin.name if destination.endswith("/") else into
            target.parent.mkdir(parents=True, exist_ok=True)
            if origin.is_dir():
                shutil.copytree(
                    origin, target, ignore=shutil.ignore_patterns("__pycache__", "*.pyc")
                )
            else:
                shutil.copy2(origin, target)
    site = tmp_path / "site"
    installed = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
         "--target", str(site), str(source)],
        capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert installed.returncode == 0, installed.stdout + installed.stderr
    config = tmp_path / "consumers.yaml"
    config.write_text(configmap_text())
    run = tmp_path / "run"
    run.mkdir()
    env = dict(os.environ, PYTHONPATH=str(site))
    where = subprocess.run(
        [sys.executable, "-c", "import json, gpugate; print(json.dumps(gpugate.__file__))"],
        capture_output=True, text=True, cwd=run, env=env, timeout=60, check=False,
    )  # fmt: skip
    assert where.returncode == 0, where.stderr
    assert json.loads(where.stdout).startswith(str(site)), where.stdout
    [entrypoint] = containerfile()["ENTRYPOINT"]
    program, command = json.loads(entrypoint)[:2]
    assert (program, command) == ("gpugate", "serve")
    checked = subprocess.run(
        [sys.executable, "-m", "gpugate", "check", str(config)],
        capture_output=True, text=True, cwd=run, env=env, timeout=60, check=False,
    )  # fmt: skip
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "ok — 2 consumers (comfyui, ollama)" in checked.stdout
    # The package data the gate serves (its dashboard) came with the copy.
    assert list((site / "gpugate" / "control" / "static").iterdir())
