"""How many bytes of VRAM a ComfyUI prompt is leased, from its files and the configuration.

In order (docs/configuration.md, "ComfyUI prompts"):

1. A measured peak of earlier runs of the same file set wins over every configured size
   (plus the per-megapixel working set for the part of this prompt's latent beyond the
   largest one measured, when the caller knows it).
2. Otherwise the sum of the files' sizes (`Consumer.files`, most specific key wins) plus the
   working set (`working_set` + `working_set_per_megapixel` x the largest latent).
3. A file no key sizes: the consumer's `envelope` is the whole prompt (never less than the
   sized files' own stage); without one, each such file counts as DEFAULT_FILE_BYTES.

ComfyUI moves its own models off the card when a later node needs the room (`free_memory`
before `load_models_gpu`), and loads a model partly when the card is short (the rest is
copied from CPU RAM for each use, slower), so a prompt also runs in far less than the sum
of its files: 128 MiB of each model of its largest stage (text encoders; diffusion model
with LoRAs and ControlNets; VAE; upscaler) beside the working set. That is the `floor`;
the sum is the ceiling. Short of the ceiling the core grants the floor, and the runtime
takes what it finds free up to the ceiling (`gpugate.core.floors`).
"""

from __future__ import annotations

import enum
from collections import defaultdict
from collections.abc import Iterable

import attrs

from gpugate.config.filesizes import DEFAULT_FILE_BYTES, best_match
from gpugate.config.model import Consumer, FileSize
from gpugate.core.residents import ResidentKey
from gpugate.core.units import GiB
from gpugate.runtimes.comfyui.graph import ModelFile, PromptDemand
from gpugate.runtimes.comfyui.settings import ComfyUISettings

PROMPT_OPTIONS = ""
"""The options half of a prompt's lease key: the files alone decide what ComfyUI keeps loaded."""


class Stage(enum.Enum):
    """Which models ComfyUI needs on the card together, by the folder they come from."""

    ENCODE = "encode"
    DIFFUSE = "diffuse"
    DECODE = "decode"
    UPSCALE = "upscale"


STAGE_OF_FOLDER = {
    "text_encoders": Stage.ENCODE,
    "clip_vision": Stage.ENCODE,
    "style_models": Stage.ENCODE,
    "gligen": Stage.ENCODE,
    "vae": Stage.DECODE,
    "vae_approx": Stage.DECODE,
    "upscale_models": Stage.UPSCALE,
}
"""Any other folder (checkpoints, diffusion_models, loras, controlnet, ...) is DIFFUSE: a
checkpoint holds its text encoder and VAE too, and counts whole there."""


class EnvelopeSource(enum.Enum):
    """Where a prompt's bytes came from."""

    MEASURED = "measured"
    FILES = "files"
    ENVELOPE = "envelope"
    """A file no key sizes; the consumer's `envelope` sized the whole prompt."""
    DEFAULT = "default"
    """A file nothing sizes; it counted as DEFAULT_FILE_BYTES."""


@attrs.frozen
class PromptSizing:
    """The sizing settings of one ComfyUI consumer."""

    files: tuple[FileSize, ...] = ()
    envelope: int | None = None
    working_set: int = GiB
    working_set_per_megapixel: int = 0

    @classmethod
    def of(cls, consumer: Consumer) -> PromptSizing:
        """The sizing a consumer's configuration gives."""
        settings = consumer.settings_as(ComfyUISettings)
        return cls(
            settings.files,
            consumer.envelope,
            settings.working_set,
            settings.working_set_per_megapixel,
        )

    def file_size(self, file: ModelFile) -> int | None:
        """The configured size of `file` (most specific key wins); None if nothing names it."""
        if file.name is None:
            return None
        entry = best_match(self.files, file.folder, file.name)
        return None if entry is None else entry.size

    def working_set_for(self, megapixels: float) -> int:
        """The working set of a prompt whose largest latent has `megapixels`."""
        return self.working_set + round(self.working_set_per_megapixel * megapixels)


@attrs.frozen
class PromptEnvelope:
    """A prompt's VRAM: what to lease, the least it can run in, and how it was found."""

    bytes: int
    """What to lease."""
    floor: int
    """The least the prompt can run in: its largest stage partly loaded (128 MiB of each of
    its models) and the working set."""
    source: EnvelopeSource
    working_set: int
    unsized: tuple[ModelFile, ...] = ()
    """Files nothing in `files` sized."""


LOWVRAM_WEIGHTS = 128 * 1024 * 1024
"""The least of a model ComfyUI puts on the card when it is short: in NORMAL_VRAM it loads
a model partially (lowvram), `lowvram_model_memory = max(128 MiB, free − minimum memory
required)` (comfy/model_management.py `load_models_gpu`), and copies the rest from CPU RAM
for each use (comfy/ops.py `cast_bias_weight`): slower, not a failure."""
MINIMUM_INFERENCE = 819 * 1024 * 1024
"""`minimum_inference_memory()` less the reserve (0.8 GiB): the least working memory
ComfyUI loads a model beside."""


def _stages(sizes: Iterable[tuple[ModelFile, int]], each: int | None = None) -> int:
    """The largest stage (the models a node needs together): whole, or with `each`, the
    least of each model on the card (the model where it is smaller)."""
    by_stage: dict[Stage, int] = defaultdict(int)
    for file, size in sizes:
        stage = STAGE_OF_FOLDER.get(file.folder, Stage.DIFFUSE)
        by_stage[stage] += size if each is None else min(size, each)
    return max(by_stage.values(), default=0)


def prompt_key(consumer: str, demand: PromptDemand) -> ResidentKey:
    """The key a prompt's lease, resident and measured envelope go by (`MeasuredEnvelope`'s
    consumer, model, options): the consumer and the prompt's file set."""
    return ResidentKey(consumer, demand.key, PROMPT_OPTIONS)


def prompt_envelope(
    demand: PromptDemand,
    sizing: PromptSizing,
    measured: int | None = None,
    *,
    measured_megapixels: float | None = None,
) -> PromptEnvelope:
    """The VRAM to lease for `demand`.

    `measured`: the NVML peak of an earlier run of the same file set (`demand.key`), which
    wins; `measured_megapixels`: the largest latent among those runs, when known. The lease is
    the whole sum (the ceiling), its floor its largest stage partly loaded.
    """
    working = sizing.working_set_for(demand.megapixels)
    sized: list[tuple[ModelFile, int]] = []
    unsized: list[ModelFile] = []
    for file in demand.files:
        size = sizing.file_size(file)
        if size is None:
            unsized.append(file)
        else:
            sized.append((file, size))
    if unsized and sizing.envelope is None:
        sized += [(file, DEFAULT_FILE_BYTES) for file in unsized]
    want = sum(size for _, size in sized) + working
    floor = min(want, _stages(sized, LOWVRAM_WEIGHTS) + max(working, MINIMUM_INFERENCE))
    source = EnvelopeSource.DEFAULT if unsized else EnvelopeSource.FILES
    if unsized and sizing.envelope is not None:
        want = floor = max(sizing.envelope, _stages(sized) + working)
        source = EnvelopeSource.ENVELOPE
    if measured is not None:
        want = measured
        if measured_megapixels is not None and demand.megapixels > measured_megapixels:
            extra = demand.megapixels - measured_megapixels
            want += round(sizing.working_set_per_megapixel * extra)
        floor = min(floor, want)
        source = EnvelopeSource.MEASURED
    return PromptEnvelope(want, floor, source, working, tuple(unsized))
