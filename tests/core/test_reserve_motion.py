"""The reserve moves only for others: its history sees neither the consumers' memory nor
what their loads, unloads and starts hold where NVML does not show it under them.

The demo's failure: the sample an unloading runner had left NVML's process list
while the driver still counted its bytes read as 8 GiB of external use, and its return as
external volatility, so the reserve climbed from 1 GiB to its 2 GiB ceiling for ten minutes
with nothing external on the card.
"""

from __future__ import annotations

import attrs

from gpugate.core.classes import PriorityClass, ResidencyPolicy
from gpugate.core.effects import Event, EventKind, Grant, Unload
from gpugate.core.listing import ListedModel
from gpugate.core.observation import OTHER, Owner, OwnerKind, ProcessUsage
from gpugate.core.tickets import LeaseScope
from gpugate.core.units import GiB, MiB
from tests.core.builders import Card, demand, gpu, host, proc, unloads

P = PriorityClass
BASE = 1 * GiB
CEILING = 2 * GiB


def demo_card() -> Card:
    """The demo's card once gemma3:12b and bge-m3 are loaded: 1 GiB reserve, 2 GiB ceiling."""
    models = (("gemma", 7796 * MiB, P.BACKGROUND), ("bge-m3", 2012 * MiB, P.BACKGROUND))
    return Card(*models, reserve=BASE, reserve_max=CEILING)


def evict_gemma(card: Card) -> Unload:
    card.now += 1.0
    admission = card.core.submit(demand("qwen", 5700 * MiB, priority=P.INTERACTIVE), card.now)
    (unload,) = unloads(admission.effects)
    assert unload.key.model == "gemma"
    return unload


def vanished_sample(card: Card, nbytes: int, *, as_other: bool = False):
    """A sample in which the unloading runner's bytes are still used but no longer under
    ollama: unattributed (it left NVML's process list), or `other` (it exited before its
    /proc entry was read)."""
    processes = [proc(100, card.loaded["bge-m3"], "ollama")]
    unattributed = 0
    if as_other:
        processes.append(ProcessUsage(101, nbytes, Owner(OwnerKind.EXTERNAL, OTHER)))
    else:
        unattributed = nbytes
    return card.core.observe(
        host(gpu(*processes, unattributed=unattributed), at=card.now), card.now
    )


def reserve(card: Card) -> int:
    budget = card.core.budget(0)
    assert budget is not None
    return budget.reserve


def test_an_unloading_runner_that_left_the_process_list_is_not_external_volatility():
    card = demo_card()
    unload = evict_gemma(card)
    card.now += 0.1
    vanished_sample(card, 7796 * MiB)
    assert reserve(card) == BASE
    card.now += 0.1
    [*card.unloaded(unload)]
    assert reserve(card) == BASE
    for _ in range(20):
        card.now += 0.5
        card.sample()
        assert reserve(card) == BASE, "no external use: the reserve stays at its base"


def test_an_unloading_runner_read_as_nobodys_process_is_not_external_volatility():
    card = demo_card()
    unload = evict_gemma(card)
    card.now += 0.1
    vanished_sample(card, 7796 * MiB, as_other=True)
    card.now += 0.1
    card.unloaded(unload)
    card.now += 0.5
    card.sample()
    assert reserve(card) == BASE


def test_what_an_unload_leaves_in_the_drivers_hands_settles_without_raising_the_reserve():
    # The gate confirms an unload at 75 % of its bytes back; the rest may show as used
    # memory no process holds for a moment after.
    card = demo_card()
    unload = evict_gemma(card)
    card.now += 0.2
    card.unloaded(unload)
    lingering = 7796 * MiB // 4
    for _ in range(4):
        card.now += 0.5
        card.core.observe(
            host(
                gpu(proc(100, card.loaded["bge-m3"], "ollama"), unattributed=lingering), at=card.now
            ),
            card.now,
        )
    card.now += 0.5
    card.sample()
    assert reserve(card) == BASE


def test_used_memory_nobody_holds_long_after_an_unload_is_external():
    card = demo_card()
    unload = evict_gemma(card)
    card.now += 0.2
    (grant,) = [e for e in card.unloaded(unload) if isinstance(e, Grant)]
    card.core.loaded(grant.lease.id, card.now)  # qwen is loaded: nothing is in motion
    card.loaded["qwen"] = grant.lease.pending
    card.now += 30.0  # far past the settle time (5 s)
    card.sample()
    card.now += 0.5
    rows = [proc(100 + i, n, "ollama") for i, n in enumerate(card.loaded.values())]
    card.core.observe(host(gpu(*rows, unattributed=1 * GiB), at=card.now), card.now)
    card.now += 0.5
    card.sample()
    assert reserve(card) == CEILING, "1 GiB that came and went: the reserve grows to its ceiling"


def test_a_start_whose_memory_nvml_does_not_show_under_its_process_yet_is_the_gates():
    card = demo_card()
    start = attrs.evolve(demand("whisper", 2 * GiB, consumer="comfy"), scope=LeaseScope.PROCESS)
    card.now += 1.0
    admission = card.core.submit(start, card.now)
    assert admission.lease is not None
    # The process holds its bytes before NVML lists it: used memory nobody accounts for.
    card.now += 0.3
    card.core.observe(
        host(
            gpu(*(proc(100 + i, n, "ollama") for i, n in enumerate(card.loaded.values())),
                unattributed=2 * GiB),
            at=card.now,
        ),
        card.now,
    )  # fmt: skip
    card.now += 0.3
    card.comfy = 2 * GiB
    card.sample()
    assert reserve(card) == BASE


def test_external_use_that_rose_and_fell_still_grows_the_reserve_while_the_gate_unloads():
    card = demo_card()
    unload = evict_gemma(card)
    card.external = 1500 * MiB
    card.now += 0.1
    card.sample()
    card.external = 0
    card.now += 0.1
    card.unloaded(unload)
    card.now += 0.5
    card.sample()
    assert reserve(card) == CEILING, "plex came and went: its volatility counts"


def test_a_configured_service_is_never_taken_for_the_gates_own_unload():
    card = demo_card()
    unload = evict_gemma(card)
    card.now += 0.1
    card.core.observe(
        host(
            gpu(proc(100, card.loaded["bge-m3"], "ollama"),
                proc(500, 800 * MiB, "plex", managed=False), unattributed=7796 * MiB),
            at=card.now,
        ),
        card.now,
    )  # fmt: skip
    card.now += 0.1
    card.unloaded(unload)
    card.now += 0.5
    card.sample()
    assert reserve(card) == BASE + 800 * MiB


def test_a_model_its_runtime_let_go_on_its_own_settles_without_raising_the_reserve():
    # A client's own unload through the gate (`keep_alive: 0`), or the runtime's own idle
    # timer: the listing no longer has gemma, and for a moment the driver still holds what
    # its runner had (NVML: used memory no process accounts for), as after an unload the
    # gate asked for.
    card = demo_card()
    card.now += 1.0
    bge = ListedModel(
        "bge-m3", card.loaded["bge-m3"], card.loaded["bge-m3"], P.BACKGROUND,
        ResidencyPolicy.KEEP_WARM, 900.0,
    )  # fmt: skip
    gemma = card.loaded.pop("gemma")
    effects = card.core.reconcile("ollama", 0, [bge], asked_at=card.now - 0.05, now=card.now)
    (gone,) = [e for e in effects if isinstance(e, Event) and e.kind is EventKind.RESIDENT_GONE]
    assert (gone.key.model, gone.bytes) == ("gemma", gemma)
    for lingering in (gemma, gemma // 2, 0):
        card.now += 0.5
        card.core.observe(
            host(
                gpu(proc(100, card.loaded["bge-m3"], "ollama"), unattributed=lingering), at=card.now
            ),
            card.now,
        )
        assert reserve(card) == BASE
    for _ in range(4):
        card.now += 0.5
        card.sample()
    assert reserve(card) == BASE
