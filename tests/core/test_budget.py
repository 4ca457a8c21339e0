"""The budget rows: the incident's numbers, and no double counting of a loading model."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from gpugate.core.budget import compute_budget
from gpugate.core.classes import PriorityClass, ResidencyPolicy
from gpugate.core.observation import OTHER, UNATTRIBUTED, Owner, OwnerKind, ProcessUsage
from gpugate.core.residents import Resident, ResidentKey, ResidentState
from gpugate.core.tickets import Lease
from gpugate.core.units import GiB, MiB
from tests.core.builders import RESERVE, RESERVED, TOTAL, demand, gpu, proc


def incident_observation():
    return gpu(
        proc(101, 7796 * MiB, "ollama"),
        proc(102, 2012 * MiB, "ollama"),
        proc(201, 2050 * MiB, "whisper"),
        proc(301, 292 * MiB, "mvoice"),
        proc(401, 210 * MiB, "comfyui"),
        proc(501, 1536 * MiB, "plex", managed=False),
        unattributed=96 * MiB,
    )


def test_incident_rows_attribute_each_consumer_and_leave_the_formula_exact():
    budget = compute_budget(incident_observation(), sampled_at=10.0, reserve=RESERVE)

    assert budget.consumer("ollama").observed == 9808 * MiB
    assert budget.consumer("whisper").committed == 2050 * MiB
    assert budget.consumer("mvoice").committed == 292 * MiB
    assert budget.consumer("comfyui").committed == 210 * MiB
    assert [(row.name, row.bytes) for row in budget.external] == [
        ("plex", 1536 * MiB),
        (UNATTRIBUTED, 96 * MiB),
    ]
    managed = (9808 + 2050 + 292 + 210) * MiB
    external = (1536 + 96) * MiB
    assert budget.schedulable == TOTAL - RESERVED - external - managed - RESERVE
    # With nothing leased, schedulable is NVML's free minus the reserve.
    assert budget.schedulable == budget.free - RESERVE


def _lease(nbytes: int, pending: int) -> Lease:
    return Lease(
        1, demand("gemma3:12b", nbytes), granted=0.0, waited=0.0, pending=pending, loads=True
    )


def test_a_model_that_is_loading_is_counted_once():
    envelope = 8 * GiB
    lease = _lease(envelope, envelope)
    before = compute_budget(gpu(), sampled_at=0.0, reserve=RESERVE, leases=[lease])
    halfway = compute_budget(
        gpu(proc(7, envelope // 2, "ollama")), sampled_at=1.0, reserve=RESERVE, leases=[lease]
    )
    assert before.consumer("ollama").committed == envelope
    assert halfway.consumer("ollama").committed == envelope
    assert halfway.schedulable == before.schedulable


def test_unexplained_memory_is_counted_on_top_of_new_leases():
    # 3 GiB loaded behind the gate's back; then a 2 GiB lease is granted before the next sample.
    observation = gpu(proc(7, 3 * GiB, "ollama"))
    budget = compute_budget(
        observation,
        sampled_at=0.0,
        reserve=RESERVE,
        leases=[_lease(2 * GiB, 2 * GiB)],
        unexplained={"ollama": 3 * GiB},
    )
    assert budget.consumer("ollama").committed == 5 * GiB


@given(
    envelope=st.integers(min_value=0, max_value=12 * GiB),
    loaded_fraction=st.floats(min_value=0.0, max_value=1.0),
    resident_bytes=st.integers(min_value=0, max_value=3 * GiB),
    external=st.integers(min_value=0, max_value=2 * GiB),
)
def test_committed_is_never_less_than_either_view_and_never_the_sum(
    envelope: int, loaded_fraction: float, resident_bytes: int, external: int
):
    arrived = int(envelope * loaded_fraction)
    resident = Resident(
        ResidentKey("ollama", "bge-m3"),
        0,
        resident_bytes,
        PriorityClass.BACKGROUND,
        ResidencyPolicy.KEEP_WARM,
        900.0,
        state=ResidentState.RESIDENT,
    )
    observation = gpu(
        proc(1, resident_bytes, "ollama"),
        proc(2, arrived, "ollama"),
        proc(3, external, "plex", managed=False),
    )
    budget = compute_budget(
        observation,
        sampled_at=0.0,
        reserve=RESERVE,
        residents=[resident],
        leases=[_lease(envelope, envelope)],
    )
    row = budget.consumer("ollama")
    assert row.committed >= row.observed
    assert row.committed >= row.resident + row.pending
    # Counted once: the loading bytes are in `observed` and in `pending`, never added twice.
    assert row.committed == resident_bytes + envelope
    assert budget.schedulable == TOTAL - RESERVED - external - row.committed - RESERVE


def test_an_unloading_runner_that_left_the_process_list_is_not_counted_twice():
    going = Resident(
        ResidentKey("ollama", "bge-m3"),
        0,
        2 * GiB,
        PriorityClass.BACKGROUND,
        ResidencyPolicy.KEEP_WARM,
        900.0,
        state=ResidentState.UNLOADING,
    )
    # NVML: the runner is gone from the list, but `used` still holds its 2 GiB.
    observation = gpu(proc(1, 6 * GiB, "ollama"), unattributed=2 * GiB + 100 * MiB)
    staying = Resident(
        ResidentKey("ollama", "gemma"),
        0,
        6 * GiB,
        PriorityClass.INTERACTIVE,
        ResidencyPolicy.KEEP_WARM,
        900.0,
    )
    budget = compute_budget(
        observation, sampled_at=0.0, reserve=RESERVE, residents=[going, staying]
    )
    assert budget.reclaiming == 2 * GiB
    assert [(row.name, row.bytes) for row in budget.external] == [(UNATTRIBUTED, 100 * MiB)]
    assert budget.consumer("ollama").committed == 8 * GiB
    # While the runner is still listed nothing is taken off the external rows.
    listed = gpu(proc(1, 6 * GiB, "ollama"), proc(2, 2 * GiB, "ollama"), unattributed=100 * MiB)
    budget = compute_budget(listed, sampled_at=0.0, reserve=RESERVE, residents=[going, staying])
    assert budget.reclaiming == 0
    assert budget.external_total == 100 * MiB


def test_an_unloading_runner_read_as_a_process_nobody_claims_is_not_counted_twice():
    # It exited between NVML's process list and the read of its /proc entry: `other`.
    going = Resident(
        ResidentKey("ollama", "bge-m3"),
        0,
        2 * GiB,
        PriorityClass.BACKGROUND,
        ResidencyPolicy.KEEP_WARM,
        900.0,
        state=ResidentState.UNLOADING,
    )
    gone = ProcessUsage(2, 2 * GiB, Owner(OwnerKind.EXTERNAL, OTHER))
    stranger = proc(3, 300 * MiB, "plex", managed=False)
    observation = gpu(gone, stranger)
    budget = compute_budget(observation, sampled_at=0.0, reserve=RESERVE, residents=[going])
    assert budget.reclaiming == 2 * GiB
    assert [(row.name, row.bytes) for row in budget.external] == [("plex", 300 * MiB)]
    assert budget.consumer("ollama").committed == 2 * GiB


def test_an_unloading_sum_below_zero_is_no_memory_coming_back_and_no_crash():
    from gpugate.core.budget import GpuUsage, budget_of

    # A card with nothing external, and sums the books carried into a negative unloading
    # figure: the budget is still one, with nothing reclaimed (this raised KeyError).
    usage = GpuUsage(resident={"ollama": 6 * GiB}, residents={"ollama": 1},
                     unloading={"ollama": -512 * MiB})  # fmt: skip
    budget = budget_of(gpu(proc(1, 6 * GiB, "ollama")), usage, sampled_at=0.0, reserve=RESERVE)
    assert budget.reclaiming == 0 and budget.external == ()
    assert budget.consumer("ollama").committed == 6 * GiB
