"""A `systemctl` that knows a few units from a JSON file, for hosts without systemd.

    fake_systemctl.py show [--property=A,B,...] [--value] UNIT
    fake_systemctl.py is-active UNIT
    fake_systemctl.py start|stop|restart|daemon-reload [UNIT]

`$FAKE_SYSTEMD_UNITS` is a JSON object: unit name → {"ExecStart": [argv], "Environment":
{...}, "FragmentPath": "...", "DropInPaths": [...], "EnvironmentFiles": [...], "User": "...",
"ActiveState": "active"}. `show` prints the properties as systemd does (`Key=Value`; an
unknown unit is `LoadState=not-found`), `is-active` the unit's ActiveState. Verbs that would
change something only succeed. Every call is appended to `$FAKE_SYSTEMCTL_LOG`.
"""

from __future__ import annotations

import json
import os
import shlex
import sys


def exec_start(argv: list[str]) -> str:
    rest = (
        "ignore_errors=no ; start_time=[n/a] ; stop_time=[n/a] ; pid=0 ; code=(null) ; status=0/0"
    )
    return f"{{ path={argv[0]} ; argv[]={shlex.join(argv)} ; {rest} }}"


def properties(name: str, unit: dict | None) -> dict[str, str]:
    if unit is None:
        return {"Id": name, "LoadState": "not-found", "ActiveState": "inactive"}
    env = unit.get("Environment", {})
    return {
        "Id": name,
        "LoadState": "loaded",
        "ActiveState": unit.get("ActiveState", "active"),
        "FragmentPath": unit.get("FragmentPath", f"/etc/systemd/system/{name}"),
        "DropInPaths": " ".join(unit.get("DropInPaths", [])),
        "ExecStart": exec_start(unit["ExecStart"]) if unit.get("ExecStart") else "",
        "Environment": " ".join(shlex.quote(f"{k}={v}") for k, v in env.items()),
        "EnvironmentFiles": "\n".join(
            f"{path} (ignore_errors=no)" for path in unit.get("EnvironmentFiles", [])
        ),
        "User": unit.get("User", ""),
    }


def main(argv: list[str]) -> int:
    with open(os.environ["FAKE_SYSTEMCTL_LOG"], "a") as log:
        log.write(" ".join(argv) + "\n")
    with open(os.environ["FAKE_SYSTEMD_UNITS"]) as fh:
        units = json.load(fh)
    verb = argv[0]
    names = [word for word in argv[1:] if not word.startswith("-")]
    if verb == "show":
        wanted: list[str] | None = None
        for word in argv[1:]:
            if word.startswith("--property="):
                wanted = word.split("=", 1)[1].split(",")
        value_only = "--value" in argv
        for name in names:
            shown = properties(name, units.get(name))
            for key in wanted or list(shown):
                value = shown.get(key, "")
                if key == "EnvironmentFiles" and value and not value_only:
                    for line in value.splitlines():
                        print(f"{key}={line}")
                    continue
                print(value if value_only else f"{key}={value}")
        return 0
    if verb == "is-active":
        state = (units.get(names[0]) or {}).get("ActiveState", "inactive") if names else "inactive"
        print(state)
        return 0 if state == "active" else 3
    if verb in ("start", "stop", "restart", "daemon-reload"):
        return 0
    print(f"Unknown command verb {verb}.", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
