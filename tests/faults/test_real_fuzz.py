"""A slice of the fuzzer against the real whisper-server (tests.faults.real_fuzz): hostile
/load and /inference requests through the gate, and not one load the gate did not lease."""

from __future__ import annotations

from tests.faults import real_fuzz
from tests.llamaserver.conftest import locate_binary as locate_llama
from tests.whisper.conftest import locate_binary as locate_whisper


async def test_no_case_loads_a_model_the_gate_did_not_lease(tmp_path, sim_host, fakenvml_path):
    locate_whisper(real_fuzz.WHISPER)
    locate_llama(real_fuzz.LLAMA)
    report = await real_fuzz.run(80, 20261204, tmp_path / "stack", router=0.0)
    assert report.unleased == []
    assert report.whisper_loads >= 10, report.table()
    assert sum(report.kinds.values()) == 80
    answered = sum(n for key, n in report.answers.items() if key.split()[-1].isdigit())
    assert answered == 80, report.table()
