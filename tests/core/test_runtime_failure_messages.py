"""A demand that fails because the runtime could not do its part says so, not the budget."""

from __future__ import annotations

from gpugate.core.effects import Reject, Unload, UnloadReason
from gpugate.core.failures import Failure, FailureClass
from gpugate.core.units import GiB, MiB
from tests.core.builders import demand, gpu, host, make_core, proc

DOWN = Failure(
    FailureClass.RUNTIME_CRASH,
    "RUNTIME_CRASH: cannot unload llama3.2:3b: ollama upstream http://127.0.0.1:11435 did "
    "not answer (Cannot connect to host 127.0.0.1:11435)",
    consumer="ollama",
    model="llama3.2:3b",
    gpu=0,
)


def _replacing():
    """llama3.2:3b resident with num_ctx 2048; a demand for it with 4096 must replace it."""
    core = make_core()
    core.observe(host(gpu(), at=0.0), 0.0)
    first = core.submit(demand("llama3.2:3b", 3 * GiB, options="num_ctx=2048"), 1.0)
    assert first.lease is not None
    core.loaded(first.lease.id, 1.0)
    core.release(first.lease.id, 2.0)
    core.observe(host(gpu(proc(7, 3 * GiB, "ollama")), at=2.5), 2.5)
    admission = core.submit(demand("llama3.2:3b", 512 * MiB, options="num_ctx=4096"), 3.0)
    (unload,) = [e for e in admission.effects if isinstance(e, Unload)]
    assert unload.reason is UnloadReason.REPLACE
    return core, unload


def test_an_unload_the_runtime_does_not_answer_fails_the_ticket_as_the_runtime_down():
    core, unload = _replacing()
    effects = core.unloaded(unload.key, 4.0, reclaimed=False, failure=DOWN)
    (reject,) = [e for e in effects if isinstance(e, Reject)]
    failure = reject.failure
    assert failure.failure_class is FailureClass.RUNTIME_CRASH
    assert failure.message.startswith(
        "RUNTIME_CRASH: llama3.2:3b cannot be loaded: ollama is not answering; "
    ), failure.message
    assert "did not answer (Cannot connect" in failure.message
    assert "schedulable" not in failure.message
    assert "evictable" not in failure.message


def test_an_unload_whose_memory_did_not_come_back_still_explains_the_budget():
    core, unload = _replacing()
    effects = core.unloaded(unload.key, 4.0, reclaimed=False)
    (reject,) = [e for e in effects if isinstance(e, Reject)]
    assert reject.failure.failure_class is FailureClass.GPU_MEMORY_NOT_RECLAIMED
    assert "schedulable on GPU 0" in reject.failure.message
