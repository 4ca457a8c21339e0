"""`gpugate init` as a command: where it writes, what it refuses, how it exits."""

from __future__ import annotations

import contextlib
import io
from pathlib import Path

import pytest

from gpugate.cli import main
from gpugate.commands.init import EXIT_CANTCREAT, _gpugate_program
from gpugate.init.systemd import UNIT_PROPERTIES
from gpugate.init.write import dry_run_text, split_dry_run
from gpugate.packaged import shared
from gpugate.runtimes.sections import load_config_text_with_warnings
from gpugate_sim.device import SimulatedGpuHost
from tests.gpu.proctree import ProcTree
from tests.init.simhost import fake_systemctl


def run(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(["init", *argv])
        except SystemExit as exc:  # argparse's refusals
            code = int(exc.code or 0)
    return code, out.getvalue(), err.getvalue()


@pytest.fixture
def quiet_host(tmp_path: Path, sim_host: SimulatedGpuHost, fakenvml_path: Path) -> list[str]:
    """A card with nothing on it and a proc tree with one Plex: the options that read them."""
    tree = ProcTree(tmp_path / "proc")
    tree.add(
        4000,
        comm="Plex Media Serv",
        argv=["/usr/lib/plexmediaserver/Plex Media Server"],
        cgroup="0::/user.slice/user-1000.slice/session-2.scope",
    )
    return ["--proc-root", str(tree.root), "--nvml-library", str(fakenvml_path), "--no-ask"]


def test_init_writes_its_files_into_a_new_directory_and_never_over_one(
    tmp_path: Path, quiet_host: list[str]
) -> None:
    out = tmp_path / "proposal"
    code, printed, err = run("--out", str(out), *quiet_host)
    assert code == 0, err
    assert sorted(p.name for p in out.iterdir()) == [
        "consumers.yaml",
        "gpugate.service",
        "moves.txt",
    ]
    assert f"gpugate init: wrote {out / 'consumers.yaml'}" in printed
    # The gate's unit is the packaged one, for the gpugate that ran init; nothing here is
    # admitted, so its admit token (a file that would have to exist) is not loaded.
    unit = (out / "gpugate.service").read_text()
    shipped = shared("systemd/gpugate.service").read_text()
    program = _gpugate_program()
    assert unit.split("[Unit]\n", 1)[1] == shipped.split("[Unit]\n", 1)[1].replace(
        "/usr/local/bin/gpugate", program
    ).replace("LoadCredential=admit.token:/etc/gpugate/admit.token\n", "")
    assert f"ExecStart={program} serve --config /etc/gpugate/consumers.yaml" in unit
    assert f"sudo install -m 0644 {out}/gpugate.service /etc/systemd/system/gpugate.service" in (
        printed
    )
    moves = (out / "moves.txt").read_text()
    assert printed.endswith(moves)
    assert f"sudo install -D -m 0644 {out}/consumers.yaml /etc/gpugate/consumers.yaml" in moves
    loaded = load_config_text_with_warnings((out / "consumers.yaml").read_text(), out / "c.yaml")
    assert [e.name for e in loaded.config.external] == ["plex"]
    assert [g.index for g in loaded.config.gpus] == [0]

    before = (out / "consumers.yaml").read_text()
    (out / "consumers.yaml").write_text(before + "# edited by hand\n")
    code, printed, err = run("--out", str(out), *quiet_host)
    assert code == EXIT_CANTCREAT
    assert (
        f"not overwriting {out / 'consumers.yaml'}, {out / 'gpugate.service'}, "
        f"{out / 'moves.txt'}" in err
    )
    assert (out / "consumers.yaml").read_text().endswith("# edited by hand\n")


def test_a_dry_run_writes_nothing_and_prints_every_file(
    tmp_path: Path, quiet_host: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    code, printed, err = run("--dry-run", *quiet_host)
    assert code == 0, err
    assert not (tmp_path / "gpugate-init").exists()
    files = split_dry_run(printed)
    assert list(files) == ["consumers.yaml", "gpugate.service", "moves.txt"]
    assert dry_run_text(files) == printed


def test_init_never_writes_under_etc(tmp_path: Path, quiet_host: list[str]) -> None:
    code, _, err = run("--out", "/etc/gpugate", *quiet_host)
    assert code == 64
    assert "never writes under /etc" in err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--control", "nowhere"], "--control"),
        (["--out"], "expected one argument"),
        (["--proc-roots", "/proc"], "unrecognized arguments"),
    ],
)
def test_a_wrong_command_line_is_a_usage_error(
    argv: list[str], message: str, quiet_host: list[str]
) -> None:
    code, _, err = run(*quiet_host, *argv)
    assert code == 64
    assert message in err


def test_without_nvml_it_says_so_and_proposes_what_it_can(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = fake_systemctl(tmp_path / "systemd", {}, monkeypatch)  # it knows no unit
    tree = ProcTree(tmp_path / "proc")
    tree.add(10, comm="ollama", argv=["/usr/local/bin/ollama", "serve"],
             cgroup="0::/system.slice/ollama.service")  # fmt: skip
    (tree.root / "10" / "ns").symlink_to("/proc/self/ns")  # it shares init's namespaces
    code, printed, err = run(
        "--dry-run", "--proc-root", str(tree.root), "--no-ask",
        "--nvml-library", str(tmp_path / "no-libnvidia-ml.so.1"),
    )  # fmt: skip
    assert code == 0
    assert err.startswith("gpugate init: NVML: dlopen: cannot load")
    files = split_dry_run(printed)
    config = load_config_text_with_warnings(files["consumers.yaml"], tmp_path / "c.yaml").config
    assert config.gpus == ()
    (ollama,) = config.consumers
    assert str(ollama.listen) == "127.0.0.1:11434"  # its default: nothing listens here
    assert "NVML could not be read" in files["moves.txt"]
    assert "systemctl show ollama.service: systemd does not know it" in files["moves.txt"]
    assert log.read_text().split() == ["show", "--property=" + ",".join(UNIT_PROPERTIES),
                                       "ollama.service"]  # fmt: skip
