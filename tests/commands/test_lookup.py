"""One configuration lookup and one exit-code table, command by command: every command of
the table in gpugate/cli.py, with its configuration given by --config, by $GPUGATE_CONFIG
or found as ./consumers.yaml, named but missing, found nowhere, and with a wrong command
line with and without one.

Run in this process through `gpugate.cli.main`, with the system-wide place moved into the
test's directory (so that a machine's /etc/gpugate/consumers.yaml changes nothing). A
configuration, once found, names a control port nothing listens on: a command that talks to
the gate exits 69 naming that port, which shows the file it read. `serve` hands the file it
found to the gate (recorded here, not served); `status`'s NVML fallback is made to fail, as
on a machine without a GPU.
"""

from __future__ import annotations

import contextlib
import io
from collections.abc import Callable
from pathlib import Path

import attrs
import pytest

from gpugate import cli
from gpugate.commands import status as status_command
from gpugate.commands.exits import Exit
from gpugate.config import paths
from gpugate.config.model import Address
from tests.ports import free_port

NO_NVML = "no NVML on this machine"


def refused(name: str, port: int) -> str:
    return f"gpugate {name}: no gate answers at http://127.0.0.1:{port} (Connection refused)"


@attrs.frozen
class Reader:
    """A command that reads the configuration: a command line that runs it (--config is
    put before any `--`), a wrong one, and what it says for each."""

    args: tuple[str, ...]
    bad: tuple[str, ...]
    bad_message: str
    found: Callable[[str, Path, int], tuple[int, str]] = lambda name, path, port: (
        Exit.UNAVAILABLE,
        refused(name, port),
    )
    """(exit code, a line it prints) once it has read the configuration at `path`, whose
    control port is `port`."""

    def argv(self, config: Path | None) -> list[str]:
        args = list(self.args)
        if config is None:
            return args
        if args[0] == "check":
            return [*args, str(config)]
        at = args.index("--") if "--" in args else len(args)
        return [*args[:at], "--config", str(config), *args[at:]]


UNRECOGNISED = "error: unrecognized arguments: "

READERS: dict[str, Reader] = {
    "check": Reader(
        ("check",), ("check", "a.yaml", "b.yaml"), UNRECOGNISED + "b.yaml",
        found=lambda name, path, port: (Exit.OK, f"{path}: ok — 0 consumers"),
    ),
    "status": Reader(
        ("status",), ("status", "--jsn"), UNRECOGNISED + "--jsn",
        found=lambda name, path, port: (
            Exit.UNAVAILABLE, f"{refused(name, port)}, and NVML cannot be read here: {NO_NVML}"
        ),
    ),
    "serve": Reader(
        ("serve",), ("serve", "--config"), "error: argument --config: expected one argument",
        found=lambda name, path, port: (Exit.OK, f"serving {path}"),
    ),
    "lease": Reader(
        ("lease", "--consumer", "ollama", "--bytes", "1GiB", "--", "true"),
        ("lease", "--consumer", "ollama", "--bytes", "lots", "--", "true"),
        "gpugate lease: --bytes: ",
    ),
    "admit": Reader(
        ("admit", "whisper", "--", "true"), ("admit", "whisper", "--wait", "forever"),
        "gpugate admit: --wait: ",
    ),
    "leases": Reader(("leases",), ("leases", "--follow"), UNRECOGNISED + "--follow"),
    "events": Reader(
        ("events",), ("events", "--class", "urgent"), "gpugate events: --class: unknown"
    ),
    "envelopes": Reader(("envelopes",), ("envelopes", "all"), UNRECOGNISED + "all"),
    "evict": Reader(
        ("evict", "ollama", "bge-m3"), ("evict", "ollama"),
        "error: the following arguments are required: model",
    ),
    "drain": Reader(
        ("drain", "comfyui"), ("drain",), "error: the following arguments are required: consumer"
    ),
    "undrain": Reader(
        ("undrain", "comfyui"), ("undrain",),
        "error: the following arguments are required: consumer",
    ),
    "pause": Reader(
        ("pause",), ("pause", "--gpu", "zero"), "error: argument --gpu: invalid int value"
    ),
    "resume": Reader(
        ("resume", "--gpu", "0"), ("resume", "--gpu", "zero"),
        "error: argument --gpu: invalid int value",
    ),
}  # fmt: skip
"""Every command that reads the configuration."""


@attrs.frozen
class Other:
    """A command that reads no configuration: a command line that runs it, a wrong one."""

    args: tuple[str, ...]
    bad: tuple[str, ...]
    bad_message: str


OTHERS: dict[str, Other] = {
    "init": Other(
        ("init", "--dry-run", "--no-ask"), ("init", "--control", "nowhere"),
        "gpugate init: --control: ",
    ),
    "share": Other(
        ("share", "systemd/gpugate.service"), ("share", "nowhere"),
        "gpugate share: nowhere: not among",
    ),
    "sim": Other(
        ("sim", "run", "host.yaml"), ("sim", "run"),
        "error: the following arguments are required: host_file",
    ),
    "demo": Other(
        ("demo",), ("demo", "--port-base", "1"), "gpugate demo: --port-base must be between"
    ),
}  # fmt: skip
"""The commands that work without one, reading neither --config nor $GPUGATE_CONFIG."""


def test_every_command_of_the_table_is_here():
    assert set(READERS) | set(OTHERS) == set(cli.COMMANDS)
    assert not set(READERS) & set(OTHERS)


@attrs.define
class Place:
    """The test's machine: a directory to run in, the system-wide place moved under it, a
    configuration to put where each case says."""

    root: Path
    cwd: Path
    port: int
    served: list[Path] = attrs.field(factory=list)
    asked: list[str] = attrs.field(factory=list)

    @property
    def system(self) -> Path:
        return self.root / "etc" / "gpugate" / "consumers.yaml"

    def config(self, path: Path) -> Path:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"gate:\n  control: 127.0.0.1:{self.port}\n")
        return path

    def run(self, argv: list[str]) -> tuple[int, str]:
        """The exit code and everything printed."""
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = cli.main(argv)
            except SystemExit as exc:  # argparse's refusals
                code = int(exc.code or 0)
        return code, out.getvalue() + err.getvalue()


@pytest.fixture
def place(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Place:
    cwd = tmp_path / "work"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    place = Place(tmp_path, cwd, free_port())
    monkeypatch.setattr(paths, "DEFAULT_CONFIG_PATHS", (Path("consumers.yaml"), place.system))
    for name in ("GPUGATE_CONFIG", "GPUGATE_TOKEN", "CREDENTIALS_DIRECTORY"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path / "run"))

    def serve(path: Path) -> int:
        place.served.append(path)
        print(f"serving {path}")
        return 0

    def no_nvml(config: object) -> None:
        raise RuntimeError(NO_NVML)

    real_endpoint = status_command.control_endpoint

    def endpoint(config):  # type: ignore[no-untyped-def]
        # The address status asks, moved to this test's port: a demo on this machine may
        # hold the default one.
        place.asked.append(str(config.gate.control))
        control = Address("127.0.0.1", place.port)
        return real_endpoint(attrs.evolve(config, gate=attrs.evolve(config.gate, control=control)))

    monkeypatch.setattr("gpugate.serve.run_serve", serve)
    monkeypatch.setattr(status_command, "direct_document", no_nvml)
    monkeypatch.setattr(status_command, "control_endpoint", endpoint)
    return place


CASES = ("--config", "$GPUGATE_CONFIG", "./consumers.yaml", "system-wide")


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("name", list(READERS))
def test_a_configuration_is_found_the_same_way_by_every_command(
    name: str, case: str, place: Place, monkeypatch: pytest.MonkeyPatch
) -> None:
    reader = READERS[name]
    given: Path | None = None
    if case == "--config":
        found = given = place.config(place.root / "given.yaml")
    elif case == "$GPUGATE_CONFIG":
        found = place.config(place.root / "from-env.yaml")
        monkeypatch.setenv("GPUGATE_CONFIG", str(found))
    elif case == "./consumers.yaml":
        found = Path("consumers.yaml")
        place.config(place.cwd / found)
        place.config(place.system)  # the first place that has one is read
    else:
        found = place.config(place.system)
    code, printed = place.run(reader.argv(given))
    expected_code, line = reader.found(name, found, place.port)
    assert (code, line in printed) == (expected_code, True), printed
    if name == "serve":
        assert place.served == [found]
    if name == "status":
        assert place.asked == [f"127.0.0.1:{place.port}"]


@pytest.mark.parametrize("name", list(READERS))
def test_a_configuration_named_and_not_there_is_78_naming_it(
    name: str, place: Place, monkeypatch: pytest.MonkeyPatch
) -> None:
    reader = READERS[name]
    place.config(place.cwd / "consumers.yaml")  # never read instead
    missing = place.root / "gone.yaml"
    code, printed = place.run(reader.argv(missing))
    named = (
        f"{missing}: no such file"
        if name == "check"
        else f"--config names {missing}, which does not exist"
    )
    assert (code, printed) == (Exit.CONFIG, f"gpugate {name}: {named}\n")
    monkeypatch.setenv("GPUGATE_CONFIG", str(missing))
    code, printed = place.run(reader.argv(None))
    assert (code, printed) == (
        Exit.CONFIG,
        f"gpugate {name}: $GPUGATE_CONFIG names {missing}, which does not exist\n",
    )
    assert place.served == [] and place.asked == []


@pytest.mark.parametrize("name", list(READERS))
def test_no_configuration_anywhere_is_78_naming_every_place_but_for_status(
    name: str, place: Place
) -> None:
    code, printed = place.run(READERS[name].argv(None))
    if name == "status":
        # It asks the gate at the default control address, then NVML.
        assert place.asked == ["127.0.0.1:9411"]
        assert code == Exit.UNAVAILABLE and NO_NVML in printed
        return
    assert (code, printed) == (
        Exit.CONFIG,
        f"gpugate {name}: no configuration file: $GPUGATE_CONFIG is not set and none of "
        f"{place.cwd / 'consumers.yaml'}, {place.system} exists; give --config FILE\n",
    )
    assert place.served == []


@pytest.mark.parametrize("with_configuration", [False, True], ids=["none", "found"])
@pytest.mark.parametrize("name", list(READERS) + list(OTHERS))
def test_a_wrong_command_line_is_64_whether_or_not_there_is_a_configuration(
    name: str, with_configuration: bool, place: Place
) -> None:
    if with_configuration:
        place.config(place.cwd / "consumers.yaml")
    spec = READERS.get(name) or OTHERS[name]
    code, printed = place.run(list(spec.bad))
    assert code == Exit.USAGE and spec.bad_message in printed, printed
    assert place.served == [] and place.asked == []


@pytest.mark.parametrize("name", list(OTHERS))
def test_the_commands_that_read_no_configuration_never_look_for_one(
    name: str, place: Place, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GPUGATE_CONFIG", str(place.root / "gone.yaml"))
    ran: list[str] = []
    monkeypatch.setattr("gpugate_sim.host.run_host", lambda *a, **k: ran.append("sim") or 0)
    monkeypatch.setattr("gpugate.commands.demo.run_demo", lambda *a, **k: ran.append("demo") or 0)
    (place.root / "proc").mkdir()
    extra = ["--proc-root", str(place.root / "proc"), "--nvml-library", str(place.root / "no.so")]
    code, printed = place.run([*OTHERS[name].args, *(extra if name == "init" else [])])
    assert code == Exit.OK, printed
    assert "GPUGATE_CONFIG" not in printed
    assert ran == ([] if name in ("init", "share") else [name])
