"""A `systemctl` for hosts without systemd: start, stop and is-active of simple units.

    python -m tests.e2e.fake_systemctl start|stop|is-active UNIT
    python -m tests.e2e.fake_systemctl show --property=ExecStart --value UNIT

A unit is `$FAKE_SYSTEMD_DIR/UNIT.json`: {"pre": [[argv], ...], "exec": [argv]}. `start`
runs each ExecStartPre in turn (a failing one fails the start, as systemd's does: the
main process never runs), then starts the main process detached (Type=simple: the start
job ends once it was forked) and records its PID. `stop` sends SIGTERM and waits for it
to be gone (SIGKILL after 10 s); one job of a unit runs at a time (a file lock).
`is-active` prints active or inactive (status 3); `show` prints the ExecStart property as
systemd does (`{ path=... ; argv[]=... ; ... }`).
Each call is appended to `UNIT.log` with what its ExecStartPre printed.
"""

from __future__ import annotations

import fcntl
import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path


def alive(pid: int) -> bool:
    """Whether `pid` runs (a zombie does not: nobody may reap an orphan here)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def main(argv: list[str]) -> int:
    verb, unit = argv[0], argv[-1]
    directory = Path(os.environ["FAKE_SYSTEMD_DIR"])
    spec = json.loads((directory / f"{unit}.json").read_text())
    pid_file = directory / f"{unit}.pid"
    log = (directory / f"{unit}.log").open("a")
    pid = int(pid_file.read_text()) if pid_file.exists() else None
    running = pid is not None and alive(pid)
    log.write(f"{time.time():.3f} {verb}\n")
    if verb == "show":
        command = spec["exec"]
        rest = "ignore_errors=no ; start_time=[n/a] ; stop_time=[n/a] ; pid=0 ; status=0/0"
        print(f"{{ path={command[0]} ; argv[]={shlex.join(command)} ; {rest} }}")
        return 0
    if verb == "is-active":
        print("active" if running else "inactive")
        return 0 if running else 3
    # systemd runs one job of a unit at a time: a start waits for a stop and the other way.
    lock = (directory / f"{unit}.lock").open("a")
    fcntl.flock(lock, fcntl.LOCK_EX)
    pid = int(pid_file.read_text()) if pid_file.exists() else None
    running = pid is not None and alive(pid)
    if verb == "start":
        if running:
            return 0
        for pre in spec.get("pre", []):
            done = subprocess.run(pre, capture_output=True, text=True)
            log.write(f"  ExecStartPre {done.returncode}: {done.stdout}{done.stderr}")
            if done.returncode != 0:
                print(f"Job for {unit} failed because the control process exited with error code.",
                      file=sys.stderr)  # fmt: skip
                return 1
        out = (directory / f"{unit}.out").open("a")
        child = subprocess.Popen(
            spec["exec"], stdin=subprocess.DEVNULL, stdout=out, stderr=out, start_new_session=True
        )
        pid_file.write_text(str(child.pid))
        return 0
    if verb == "stop":
        if running:
            assert pid is not None
            os.kill(pid, signal.SIGTERM)
            deadline = time.monotonic() + 10
            while alive(pid) and time.monotonic() < deadline:
                time.sleep(0.02)
            if alive(pid):
                os.kill(pid, signal.SIGKILL)
        pid_file.unlink(missing_ok=True)
        return 0
    print(f"Unknown command verb {verb}.", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
