"""Model file names and globs of a consumer's `files:` sizes, and which one a file takes.

A pattern is a file name as a graph writes it (`flux1-dev-fp8.safetensors`, `SDXL/juggernaut.
safetensors` for a file in a subfolder), optionally behind the model folder it lives in
(`diffusion_models/flux1-dev-fp8.safetensors`), with `*`, `?` and `[...]` wildcards as in a
shell (`*` also crosses `/`). Legacy folder names are read as ComfyUI's `map_legacy` reads them
(`unet` is `diffusion_models`, `clip` is `text_encoders`).

Most specific wins: an exact name before any glob, and between globs the one with more literal
characters in its name part; on a tie, a pattern with a folder before one without, then the
first written.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Iterable
from typing import Protocol, TypeVar

import attrs

from gpugate.core.units import GiB

DEFAULT_FILE_BYTES = 8 * GiB
"""What a model file counts as when neither `files` nor the consumer's `envelope` sizes it."""
LEGACY_FOLDERS = {"unet": "diffusion_models", "clip": "text_encoders"}
"""ComfyUI's `folder_paths.map_legacy`."""
MODEL_FOLDERS = frozenset(
    {
        "checkpoints", "configs", "loras", "vae", "text_encoders", "diffusion_models",
        "clip_vision", "style_models", "embeddings", "diffusers", "vae_approx", "controlnet",
        "gligen", "upscale_models", "latent_upscale_models", "hypernetworks", "photomaker",
        "classifiers", "model_patches", "audio_encoders", *LEGACY_FOLDERS,
    }
)  # fmt: skip
"""`folder_paths.folder_names_and_paths` keys: a first path part naming one is a folder."""

_WILD = re.compile(r"[*?\[]")


def canonical_folder(folder: str) -> str:
    """The folder as ComfyUI names it today (`unet` -> `diffusion_models`)."""
    return LEGACY_FOLDERS.get(folder, folder)


def _check_brackets(name: str, written: str) -> None:
    """A `[` must close with a `]` after at least one character (fnmatch would read it as text)."""
    index = 0
    while (start := name.find("[", index)) != -1:
        end = start + 1
        if end < len(name) and name[end] == "!":
            end += 1
        if end < len(name) and name[end] == "]":
            end += 1
        end = name.find("]", end)
        if end == -1:
            raise ValueError(f"unclosed '[' in {written!r} (write '[[]' for a literal '[')")
        index = end + 1


@attrs.frozen
class FilePattern:
    """One key of `files:`: an optional model folder and a file name or glob."""

    folder: str | None
    name: str

    @classmethod
    def parse(cls, text: str) -> FilePattern:
        """Read `name`, `folder/name` or a glob of either; ValueError for what cannot match."""
        written = text
        text = text.strip()
        if not text:
            raise ValueError("expected a file name or a glob like 'flux1-dev*.safetensors'")
        if "\\" in text:
            raise ValueError(f"write '/' between folders, not '\\', in {written!r}")
        folder, slash, rest = text.partition("/")
        if slash and folder in MODEL_FOLDERS:
            name, folder_name = rest, canonical_folder(folder)
        else:
            name, folder_name = text, None
        if not name or name.startswith("/") or name.endswith("/") or "//" in name:
            raise ValueError(f"expected a file name after the folder in {written!r}")
        _check_brackets(name, written)
        return cls(folder_name, name)

    @property
    def label(self) -> str:
        """The pattern as written, with its folder's current name."""
        return f"{self.folder}/{self.name}" if self.folder else self.name

    def __str__(self) -> str:
        return self.label

    @property
    def is_glob(self) -> bool:
        return _WILD.search(self.name) is not None

    def matches(self, folder: str, name: str) -> bool:
        """Whether the file `name` of model folder `folder` is one this pattern names."""
        if self.folder is not None and self.folder != canonical_folder(folder):
            return False
        name = name.replace("\\", "/")
        if not self.is_glob:
            return name == self.name
        return fnmatch.fnmatchcase(name, self.name)

    def specificity(self) -> tuple[int, int, int]:
        """Larger is more specific: exact before glob, more literal characters, a folder."""
        literal = len(_WILD.sub("", re.sub(r"\[[^\]]*\]", "?", self.name)))
        return (0 if self.is_glob else 1, literal, 1 if self.folder else 0)


class Sized(Protocol):
    """A `files:` entry: a pattern and its size."""

    @property
    def pattern(self) -> FilePattern: ...

    @property
    def size(self) -> int: ...


_Entry = TypeVar("_Entry", bound=Sized)


def best_match(entries: Iterable[_Entry], folder: str, name: str) -> _Entry | None:
    """The most specific entry naming file `name` of `folder`; the first written on a tie."""
    best: _Entry | None = None
    for entry in entries:
        if not entry.pattern.matches(folder, name):
            continue
        if best is None or entry.pattern.specificity() > best.pattern.specificity():
            best = entry
    return best
