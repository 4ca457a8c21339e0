from __future__ import annotations

import attrs
import pytest

from tests.gate.harness import running_stack

CONTROL_TOKEN = "control-secret-token"
TRAINER_TOKEN = "trainer-secret-token"
IDENTITIES = f"""\
identities:
  - name: trainer
    class: background
    max_class: interactive
    tokens: ["{TRAINER_TOKEN}"]
  - name: other
    class: background
    tokens: ["other-secret-token"]
"""


@pytest.fixture
async def stack(tmp_path, sim_host, fakenvml_path):
    async with running_stack(tmp_path, sim_host, fakenvml_path, extra=IDENTITIES) as stack:
        # The control app reads the running configuration on every request.
        gate = stack.gate
        gate.config = attrs.evolve(
            gate.config, gate=attrs.evolve(gate.config.gate, control_tokens=(CONTROL_TOKEN,))
        )
        yield stack


def admin() -> dict[str, str]:
    return {"Authorization": f"Bearer {CONTROL_TOKEN}"}


def trainer() -> dict[str, str]:
    return {"Authorization": f"Bearer {TRAINER_TOKEN}"}
