from __future__ import annotations

import pytest

from tests.gate.harness import running_stack


@pytest.fixture
async def stack(tmp_path, sim_host, fakenvml_path):
    async with running_stack(tmp_path, sim_host, fakenvml_path) as stack:
        yield stack
