"""A runtime's listing while the gate unloads a model: the unload decides its end.

Ollama lists a runner until it has reaped its process, after the memory is back; the
gate ends an unload only once the listing no longer names the model (gate/unloads.py).
Until then the books keep the resident as unloading, and a listing that names it must
neither adopt it again nor count it gone.
"""

from __future__ import annotations

from gpugate.core.classes import PriorityClass, ResidencyPolicy
from gpugate.core.effects import EventKind, Unload, UnloadReason
from gpugate.core.residents import ANY_OPTIONS, ResidentKey, ResidentState
from gpugate.core.state import ListedModel
from gpugate.core.units import GiB
from tests.core.builders import gpu, host, make_core, proc

KEY = ResidentKey("ollama", "llama3.2:3b", ANY_OPTIONS)
LISTED = ListedModel(
    "llama3.2:3b", 3 * GiB, 3 * GiB, PriorityClass.INTERACTIVE, ResidencyPolicy.KEEP_WARM, 10.0
)


def kinds(effects) -> list[EventKind]:
    return [e.kind for e in effects if hasattr(e, "kind") and isinstance(e.kind, EventKind)]


def adopted_then_expired():
    """A model loaded behind the gate's back, adopted from the listing, then past its ttl."""
    core = make_core()
    core.observe(host(gpu(proc(66, 3 * GiB, "ollama")), at=1.0), 1.0)
    adopted = core.reconcile("ollama", 0, [LISTED], asked_at=1.0, now=1.0)
    assert kinds(adopted) == [EventKind.OUT_OF_BAND_RESIDENT]
    effects = core.tick(12.0)
    (unload,) = [e for e in effects if isinstance(e, Unload)]
    assert (unload.key, unload.reason) == (KEY, UnloadReason.TTL)
    return core


def test_a_listing_that_still_names_a_model_being_unloaded_changes_nothing():
    core = adopted_then_expired()
    # Its memory is back; the runtime has not reaped the runner yet and still lists it.
    core.observe(host(gpu(), at=12.5), 12.5)
    effects = core.reconcile("ollama", 0, [LISTED], asked_at=12.5, now=12.6)
    assert EventKind.OUT_OF_BAND_RESIDENT not in kinds(effects)
    assert EventKind.RESIDENT_GONE not in kinds(effects)
    resident = core.resident(KEY)
    assert resident is not None and resident.state is ResidentState.UNLOADING
    assert [r.key for r in core.residents()] == [KEY]


def test_a_listing_without_it_leaves_the_end_to_the_unload():
    core = adopted_then_expired()
    effects = core.reconcile("ollama", 0, [], asked_at=12.5, now=12.6)
    assert EventKind.RESIDENT_GONE not in kinds(effects)
    assert core.resident(KEY) is not None
    core.observe(host(gpu(), at=12.9), 12.9)
    done = core.unloaded(KEY, 13.0, reclaimed=True)
    assert kinds(done) == [EventKind.EVICTION_DONE]
    assert core.residents() == []
    again = core.reconcile("ollama", 0, [], asked_at=13.0, now=13.1)
    assert kinds(again) == []
    assert core.residents() == []
    assert core.budget(0).consumer("ollama").committed == 0


def test_a_listing_asked_before_the_unload_ended_does_not_adopt_the_model_again():
    core = adopted_then_expired()
    core.observe(host(gpu(), at=12.9), 12.9)
    core.unloaded(KEY, 13.0, reclaimed=True)
    # A periodic listing asked at 12.8, answered after the unload ended, still names it.
    stale = core.reconcile("ollama", 0, [LISTED], asked_at=12.8, now=13.2)
    assert EventKind.OUT_OF_BAND_RESIDENT not in kinds(stale)
    assert core.residents() == []
    # Loaded again behind the gate's back afterwards: a later listing adopts it.
    core.observe(host(gpu(proc(67, 3 * GiB, "ollama")), at=14.0), 14.0)
    fresh = core.reconcile("ollama", 0, [LISTED], asked_at=14.0, now=14.1)
    assert kinds(fresh) == [EventKind.OUT_OF_BAND_RESIDENT]
    assert core.resident(KEY) is not None
