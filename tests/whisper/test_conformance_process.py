"""whisper-server's life as a process, the real build and the simulator alike: it loads its
model before it binds its port, exits 3 when the model does not load and 1 when the port is
taken, stops on SIGTERM with status 0, and takes unknown options as a reason to exit 0."""

from __future__ import annotations

import signal
import socket

import pytest

from tests.ports import free_port
from tests.whisper.conftest import Models
from tests.whisper.fifo import feed, make_fifo, wait_until


def refused(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=5).close()
    except ConnectionRefusedError:
        return True
    return False


def test_it_loads_its_model_before_it_binds_its_port(starter, models: Models, tmp_path):
    pipe = make_fifo(tmp_path / "slow.bin")
    server = starter(["-m", str(pipe)], wait=False)
    wait_until(lambda: server.loads() == [str(pipe)], "the load to start")
    assert refused(server.port), "no port while the model loads"
    feed(pipe, models.english.read_bytes())
    server.wait_healthy()
    assert server.answers()


@pytest.mark.parametrize("what", ["missing", "not_a_model", "directory", "truncated"])
def test_a_model_that_does_not_load_ends_it_with_3(starter, models, tmp_path, what):
    if what == "truncated":
        path = tmp_path / "truncated.bin"
        path.write_bytes(models.english.read_bytes()[:300_000])
    else:
        path = getattr(models, what)
    server = starter(["-m", str(path)], wait=False)
    assert server.wait_exit() == 3
    assert server.stderr().splitlines()[-1] == "error: failed to initialize whisper context"
    assert server.loads() == [str(path)]
    assert refused(server.port)


def test_sigterm_stops_it_with_status_0(starter, models):
    server = starter(["-m", str(models.english)])
    server.wait_settled()
    server.proc.send_signal(signal.SIGTERM)
    assert server.wait_exit() == 0
    out = server.stdout()
    assert f"whisper server listening at http://127.0.0.1:{server.port}" in out
    assert "Caught signal 15, shutting down gracefully..." in out


def test_a_taken_port_ends_it_with_1_after_the_load(starter, models):
    port = free_port()
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", port))
        taken.listen()
        server = starter(["-m", str(models.english)], wait=False, port=port)
        assert server.wait_exit() == 1
    assert server.loads() == [str(models.english)]
    assert f"couldn't bind to server socket: hostname=127.0.0.1 port={port}" in server.stderr()


def test_an_unknown_option_prints_usage_and_exits_0(starter, models):
    server = starter(["-m", str(models.english), "--no-such-option"], wait=False)
    assert server.wait_exit() == 0
    err = server.stderr()
    assert "error: unknown argument: --no-such-option" in err
    assert "usage: " in err
    assert server.loads() == []
