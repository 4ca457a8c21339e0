"""A started process's peak: what the samples showed of it, whatever its books say."""

from __future__ import annotations

from types import SimpleNamespace

from gpugate.core.books import Books
from gpugate.core.classes import PriorityClass, ResidencyPolicy
from gpugate.core.observation import GpuObservation, Owner, OwnerKind, ProcessUsage
from gpugate.core.residents import Resident, ResidentKey
from gpugate.core.units import GiB, MiB
from gpugate.gate.envelopes import EnvelopeBook
from gpugate.gate.process_envelopes import ProcessEnvelopes

MODEL = "models/ggml-large-v3-turbo.bin"
KEY = ResidentKey("whisper", MODEL)
ENVELOPE = 2050 * MiB
"""The configured envelope: what its first start is leased, and its resident's bytes."""


def card(held: int) -> GpuObservation:
    owner = Owner(OwnerKind.CONSUMER, "whisper")
    process = ProcessUsage(4242, held, owner, "whisper-server")
    return GpuObservation(0, "GPU-0", "card", 16 * GiB, 0, held, 16 * GiB - held, (process,))


def learning(resident: Resident) -> tuple[ProcessEnvelopes, EnvelopeBook, dict]:
    books = Books()
    books.residents[resident.key] = resident
    observations: dict[int, GpuObservation] = {}
    core = SimpleNamespace(
        books=books,
        resident=books.residents.get,
        telemetry=SimpleNamespace(observations=observations),
    )
    lifecycle = SimpleNamespace(process_model=lambda: MODEL)
    links = {"whisper": SimpleNamespace(runtime=SimpleNamespace(lifecycle=lifecycle))}
    envelopes = EnvelopeBook(None, lambda: 0.0)
    learner = ProcessEnvelopes(core, links, envelopes)  # type: ignore[arg-type]
    learner.started(resident.key)
    return learner, envelopes, observations


def test_a_busy_process_is_learned_at_what_nvml_shows_not_at_its_lease() -> None:
    # Its first request is in flight: its resident keeps the lease's envelope (residents
    # follow NVML only when idle) while the sample shows the process holding 1,400 MiB.
    resident = Resident(
        KEY, 0, ENVELOPE, PriorityClass.BACKGROUND, ResidencyPolicy.KEEP_WARM, 600.0,
        in_flight=1, tracks_observed=True, process=True, shown=True,
    )  # fmt: skip
    learner, envelopes, observations = learning(resident)
    observations[0] = card(1400 * MiB)
    learner.observe()
    assert envelopes.measured(KEY) == 1400 * MiB
    # A higher sample later in the run is its peak; a lower one changes nothing.
    observations[0] = card(1500 * MiB)
    learner.observe()
    observations[0] = card(1300 * MiB)
    learner.observe()
    assert envelopes.measured(KEY) == 1500 * MiB


def test_nothing_is_learned_before_nvml_showed_the_process() -> None:
    resident = Resident(
        KEY, 0, ENVELOPE, PriorityClass.BACKGROUND, ResidencyPolicy.KEEP_WARM, 600.0,
        tracks_observed=True, process=True,
    )  # fmt: skip
    learner, envelopes, observations = learning(resident)
    observations[0] = card(1400 * MiB)
    learner.observe()
    assert envelopes.measured(KEY) is None
