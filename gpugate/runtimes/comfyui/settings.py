"""ComfyUI's own section of a consumer (`comfyui:`): how its prompts are sized and read."""

from __future__ import annotations

from typing import ClassVar

import attrs

from gpugate.config.consumer import Consumer, FileSize, RuntimeSettings
from gpugate.config.fields import BY_PATTERN, CORS_ORIGIN, SIZE
from gpugate.config.filesizes import DEFAULT_FILE_BYTES, best_match
from gpugate.config.findings import Findings
from gpugate.core.units import GiB, format_gib


@attrs.frozen
class ComfyUISettings(RuntimeSettings):
    """What sizes a ComfyUI prompt, and how ComfyUI reads requests where the gate listens."""

    jobs: ClassVar[bool] = True
    one_device: ClassVar[bool] = True
    controlled: ClassVar[bool] = False

    files: tuple[FileSize, ...] = attrs.field(default=(), metadata=BY_PATTERN)
    """VRAM of each model file a prompt may load, by name or glob."""
    working_set: int = attrs.field(default=GiB, metadata=SIZE)
    """Bytes a prompt needs beyond its files' weights (activations, latents)."""
    working_set_per_megapixel: int = attrs.field(default=0, metadata=SIZE)
    """More working set per megapixel (1024x1024) of a prompt's largest latent."""
    validate_prompts: bool = True
    """Apply ComfyUI's own validation (from its /object_info) before a lease, so a prompt
    it will refuse evicts nothing. Off where custom nodes rewrite prompts as they arrive
    (prompt handlers), which the gate cannot see."""
    cors_header: str | None = attrs.field(default=None, metadata=CORS_ORIGIN)
    """The origin its `--enable-cors-header` names ("*" when the flag is given bare); None:
    the flag is not given, so ComfyUI's Host/Origin check is on."""

    def file_size(self, folder: str, name: str) -> int | None:
        """The size `files` gives model file `name` of `folder` (most specific wins), if any."""
        entry = best_match(self.files, folder, name)
        return None if entry is None else entry.size

    def check(self, consumer: Consumer, path: str, findings: Findings) -> None:
        files_written = f"{path}.files", f"{path}.{consumer.runtime}.files"
        if (
            not self.files
            and consumer.envelope is None
            and not any(findings.has_errors_under(where) for where in files_written)
        ):
            findings.warn(
                path,
                "no files and no envelope: every model file a prompt loads counts as "
                f"{format_gib(DEFAULT_FILE_BYTES)} (give their sizes in files)",
            )
