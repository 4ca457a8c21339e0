"""A slice of the fuzzer against the real runtimes (tests.faults.real_fuzz): hostile /load
and /inference requests to whisper-server (some naming files on which it exits) and
completions and /models/load to the llama-server router at its --models-max, through the
gate: not one load the gate did not lease, the router's models always the books', and no
model the router unloaded of its own accord."""

from __future__ import annotations

from tests.faults import real_fuzz
from tests.llamaserver.conftest import locate_binary as locate_llama
from tests.whisper.conftest import locate_binary as locate_whisper


async def test_no_case_loads_a_model_the_gate_did_not_lease(tmp_path, sim_host, fakenvml_path):
    locate_whisper(real_fuzz.WHISPER)
    locate_llama(real_fuzz.LLAMA)
    report = await real_fuzz.run(120, 20261204, tmp_path / "stack", router=0.3)
    assert report.unleased == [] and report.books_differ == [], report.table()
    assert report.router_evictions == 0, report.table()
    assert report.whisper_loads >= 10, report.table()
    assert report.whisper_ends >= 1 and report.crashes == 0, report.table()
    assert report.router_loads >= 5 and report.gate_evictions >= 2, report.table()
    assert sum(report.kinds.values()) == 120
    answered = sum(n for key, n in report.answers.items() if key.split()[-1].isdigit())
    assert answered == 120, report.table()
