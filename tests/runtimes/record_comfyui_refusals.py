"""Record ComfyUI's answers to the refusal corpus (comfyui_refusals.py) into its JSON file.

Not part of the suite. Run against an unmodified ComfyUI 0.3.64 (`main.py --cpu`) whose
folders hold what the corpus module's docstring lists (the checkpoint may be an empty
file: a refused prompt never loads it) and custom_nodes/checked_nodes.py defining the
classes gpugate.sim.comfyui.custom_pack describes:

    .venv/bin/python -m tests.runtimes.record_comfyui_refusals http://127.0.0.1:8188
"""

from __future__ import annotations

import json
import sys
import urllib.error
import urllib.request
from typing import Any

from tests.runtimes.comfyui_refusals import ANSWERS, corpus


def post(url: str, prompt: Any) -> tuple[int, Any]:
    data = json.dumps({"prompt": prompt}).encode()
    request = urllib.request.Request(f"{url}/prompt", data=data, method="POST")
    try:
        with urllib.request.urlopen(request) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        raw = exc.read()
        try:
            return exc.code, json.loads(raw)
        except ValueError:
            return exc.code, raw.decode("utf-8", "replace")


def main(url: str) -> int:
    recorded: dict[str, Any] = {}
    accepted = []
    for what, prompt in corpus():
        status, body = post(url, prompt)
        if status == 200:
            accepted.append(what)
        if isinstance(body, dict):
            for entry in body.get("node_errors", {}).values():
                for reason in entry["errors"]:
                    if "traceback" in reason.get("extra_info", {}):
                        reason["extra_info"]["traceback"] = []
        recorded[what] = {"status": status, "body": body}
    ANSWERS.write_text(json.dumps(recorded, indent=1, ensure_ascii=False) + "\n")
    print(f"{len(recorded)} prompts, {len(accepted)} accepted: {accepted}")
    return 1 if accepted else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
