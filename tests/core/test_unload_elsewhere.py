"""A model asked for while it is being unloaded from one of its consumer's two cards: the
request waits for that unload (as the runtime does) wherever it was queued, the books hold
the model once, and their per-card sums stay a recount at every step. Before, a ticket on
the other card took the model's one entry in the books: the unloading card's sums went
below zero, and the unload's end then took the new load out of the books."""

from __future__ import annotations

from gpugate.core.books import Books
from gpugate.core.effects import Grant, Unload, UnloadReason
from gpugate.core.placement import place
from gpugate.core.residents import Resident, ResidentKey, ResidentState
from gpugate.core.state import GateCore
from gpugate.core.units import GiB
from gpugate.core.waits import WaitReason, queue_view
from tests.core.builders import assert_sums_recounted, demand, host, proc
from tests.core.test_placement import CARDS, cards, core_on, load

KEY = ResidentKey("ollama", "m")
SIZE = 10 * GiB


def unloading_on_card_1() -> GateCore:
    """`m` loaded on card 1, then past its TTL: its unload under way."""
    core = core_on(*cards())
    load(core, demand("m", SIZE, ttl=10.0, gpu_index=1), 1.0)
    runner = (proc(7, SIZE, "ollama"),)
    core.observe(host(*cards((), runner), at=19.0), 19.0)
    effects = core.tick(20.0)
    assert [e.key for e in effects if isinstance(e, Unload)] == [KEY]
    core.observe(host(*cards((), runner), at=20.5), 20.5)
    assert core.resident(KEY).state is ResidentState.UNLOADING
    assert_sums_recounted(core)
    return core


def loaded_once_unloaded(core: GateCore, ticket_id: int, *, gpu: int) -> Resident:
    """End the unload: the waiting ticket is granted a load of the whole model on `gpu`,
    which then completes; the one resident left, the sums a recount at each step."""
    effects = core.unloaded(KEY, 22.0, reclaimed=True)
    effects += core.observe(host(*cards(), at=22.5), 22.5)
    (grant,) = [e for e in effects if isinstance(e, Grant) and e.ticket_id == ticket_id]
    assert (grant.lease.gpu, grant.lease.pending) == (gpu, SIZE)
    assert_sums_recounted(core)
    core.loaded(grant.lease.id, 23.0)
    core.release(grant.lease.id, 23.5)
    (resident,) = core.residents()
    assert (resident.gpu, resident.state) == (gpu, ResidentState.RESIDENT)
    assert_sums_recounted(core)
    return resident


def test_the_gate_places_a_request_where_its_model_is_being_unloaded_and_it_waits_there():
    core = unloading_on_card_1()
    placement = place(core, demand("m", SIZE), CARDS, 21.0)
    assert [s.gpu for s in placement.shares] == [1]
    assert "being unloaded from GPU 1" in placement.why
    (placed,) = placement.demands(demand("m", SIZE))
    admission = core.submit(placed, 21.0)
    assert admission.lease is None and admission.failure is None  # it waits
    assert_sums_recounted(core)
    core.observe(host(*cards(), at=21.5), 21.5)
    resident = loaded_once_unloaded(core, admission.ticket_id, gpu=1)
    assert resident.bytes == SIZE


def test_a_ticket_on_the_other_card_waits_for_the_unload_then_loads_there_once():
    core = unloading_on_card_1()
    admission = core.submit(demand("m", SIZE, gpu_index=0), 21.0)
    assert admission.lease is None and admission.failure is None
    assert core.resident(KEY).gpu == 1  # the unloading copy is still the one in the books
    assert core.budget(0).schedulable == 24 * GiB  # it holds nothing back on card 0
    (waiting,) = queue_view(core, 21.0)
    assert (waiting.wait.reason, waiting.wait.unloading) == (WaitReason.UNLOAD, (KEY,))
    assert waiting.wait.line.startswith("its model is unloading from GPU 1, to load again after")
    assert_sums_recounted(core)
    loaded_once_unloaded(core, admission.ticket_id, gpu=0)


def test_the_books_count_a_replaced_copy_off_its_own_card_and_keep_a_load_its_unload_did_not_free():
    """The books alone (what the planner no longer asks of them): a load of the model on card
    0 while its copy on card 1 unloads keeps both cards' sums a recount, and the end of
    card 1's unload leaves card 0's load in the books."""
    books = Books()
    books.open_lease(1, demand("m", SIZE, gpu_index=1), 1.0, 1.0, SIZE, None)
    books.close_lease(1, 2.0, failed=False)
    books.usage(0)  # the sums counted, so that what follows is carried into them
    copy = books.residents[KEY]
    books.start_unload(copy, reason=UnloadReason.TTL, ticket_id=None, now=3.0)
    assert books.usage(1).unloading == {"ollama": SIZE}
    books.open_lease(2, demand("m", SIZE, gpu_index=0), 4.0, 4.0, SIZE, None)
    carried = {gpu: books.usage(gpu) for gpu in CARDS}
    assert carried[0].unloading == {} and carried[1].unloading == {}
    assert carried[0].pending == {"ollama": SIZE} and carried[1].residents == {}
    finished = books.finish_unload(KEY)
    assert finished is not None and finished[1] is None
    assert books.residents[KEY].gpu == 0 and books.residents[KEY].state is ResidentState.LOADING
