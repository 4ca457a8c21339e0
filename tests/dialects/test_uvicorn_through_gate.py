"""Corpus U through the gate: the gate as a vLLM consumer in front of real uvicorn
(tests/dialects/uvicorn_reference.py) against that uvicorn directly.

Every case of corpus_uvicorn.py goes to both as its own test sends it; the outcomes are
compared as through_gate.py says and each case is given its `Difference`; the counts per
class are asserted as measured (docs/reliability.md, "Through the gate": what each class
holds and why), so a change that adds or removes a difference fails here.
"""

from __future__ import annotations

import collections
import os

from gpugate.runtimes.sections import load_config_text
from tests.dialects import harness, uvicorn_reference
from tests.dialects.corpus_uvicorn import corpus
from tests.dialects.through_gate import Difference, classify
from tests.dialects.wire import Outcome
from tests.ports import free_ports
from tests.serving import GATE_PREAMBLE, serving

SECONDS = 10.0

VLLM_CONFIG = (
    GATE_PREAMBLE
    + """\
  vllm:
    runtime: vllm
    listen: 127.0.0.1:{listen}
    upstream: http://127.0.0.1:{upstream}
    class: background
    residency: {{policy: keep_warm, ttl: 10m}}
    envelope: 1GiB
    processes: {{names: [vllm]}}
"""
)

EXPECTED = {
    Difference.SAME: 633,
    Difference.STATUS: 1,
}
"""Measured: cases of corpus_uvicorn.py per class through a vLLM consumer (the two HEAD
cases among the same: an echo's answer to HEAD is compared for its length being there,
through_gate.py). STATUS: `Expect: 100-continue` on a GET without a body,
which uvicorn answers `100 Continue` when its app reads the (empty) body, as the echo does
and vLLM's GET routes do not; the gate invites only a body that exists."""


def _as_outcome(outcome: harness.Outcome) -> Outcome:
    return Outcome(outcome.data, "closed" if outcome.closed else "open")


async def test_uvicorn_corpus_through_the_gate(tmp_path, sim_host, fakenvml_path):
    with uvicorn_reference.running() as upstream:
        control, listen = free_ports(2)
        text = VLLM_CONFIG.format(
            control=control, library=fakenvml_path, listen=listen, upstream=upstream
        )
        found: dict[Difference, list[str]] = collections.defaultdict(list)
        async with serving(load_config_text(text, tmp_path / "consumers.yaml")) as served:
            for case in corpus():
                direct = await harness.exchange("127.0.0.1", upstream, case, seconds=SECONDS)
                gated = await harness.exchange("127.0.0.1", listen, case, seconds=SECONDS)
                found[classify(_as_outcome(direct), _as_outcome(gated))].append(case.name)
            assert served.gate.core.leases() == []
    counts = {kind: len(names) for kind, names in found.items()}
    if os.environ.get("GPUGATE_SHOW_DIFFERENCES"):
        for kind, names in found.items():
            print(kind, len(names), names)
    assert counts == EXPECTED
