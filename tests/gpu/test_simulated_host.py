"""A gate in front of a simulated host keeps its state apart from the real host's."""

from __future__ import annotations

import ctypes.util
import logging
from pathlib import Path

from gpugate.gpu.nvml import simulated_host
from gpugate.runtimes.sections import load_config_text
from gpugate.serve import store_path

CONFIG = """\
gate:
  database: {database}
consumers: {{}}
"""


def test_the_simulated_library_names_its_state_file(fakenvml_path, monkeypatch, tmp_path):
    state = tmp_path / "host" / "nvml.state"
    monkeypatch.setenv("GPUGATE_FAKE_NVML_STATE", str(state))
    assert simulated_host(fakenvml_path) == state


def test_a_library_without_the_mark_is_a_real_one(tmp_path):
    libc = ctypes.util.find_library("c")
    assert libc is not None
    assert simulated_host(Path(libc)) is None
    assert simulated_host(tmp_path / "no-such-libnvidia-ml.so.1") is None


def test_the_store_moves_beside_the_simulated_state(tmp_path, caplog):
    real = tmp_path / "var" / "lib" / "gpugate" / "gpugate.db"
    config = load_config_text(CONFIG.format(database=real), tmp_path / "consumers.yaml")
    state = tmp_path / "sim" / "nvml.state"
    with caplog.at_level(logging.WARNING, logger="gpugate"):
        assert store_path(config, state) == state.parent.resolve() / "gpugate.db"
    assert any(str(real) in r.getMessage() for r in caplog.records)
    assert store_path(config, None) == real
    # A simulated library with no state file named stores nothing at all.
    assert store_path(config, Path()) is None
