"""What Ollama says it holds (`GET /api/ps`), read strictly: a listing the gate cannot read
is no listing (the last good one stays in the books)."""

from __future__ import annotations

import re
from datetime import datetime
from typing import Any

from gpugate.runtimes.base import AdapterError, LoadedModel
from gpugate.runtimes.ollama.names import canonical_name


class OllamaError(AdapterError):
    """Ollama answered something the adapter cannot use."""


def parse_ps(data: Any) -> list[LoadedModel]:
    """The models of an `/api/ps` answer; OllamaError for anything but `{"models": [...]}`
    whose entries have a name and integer sizes."""
    entries = data.get("models", []) if isinstance(data, dict) else None
    if entries is None and isinstance(data, dict):
        entries = []  # Ollama encodes an empty slice as null
    if not isinstance(entries, list):
        raise OllamaError(f"/api/ps answered no list of models: {str(data)[:200]}")
    models = []
    for entry in entries:
        if not isinstance(entry, dict):
            raise OllamaError(f"/api/ps listed something not a model: {str(entry)[:200]}")
        name = entry.get("name") or entry.get("model")
        sizes = [entry.get("size") or 0, entry.get("size_vram") or 0]
        if (
            not isinstance(name, str)
            or not all(type(n) is int and n >= 0 for n in sizes)  # bool is not a size
        ):
            raise OllamaError(f"/api/ps listed a model the gate cannot read: {str(entry)[:200]}")
        context_length = entry.get("context_length")
        models.append(
            LoadedModel(
                name=canonical_name(name) or name,
                size=sizes[0],
                size_vram=sizes[1],
                expires_at=parse_time(entry.get("expires_at")),
                context_length=context_length if isinstance(context_length, int) else None,
            )
        )
    return models


def parse_time(value: object) -> datetime | None:
    if not isinstance(value, str) or not value:
        return None
    text = re.sub(r"(\.\d{6})\d+", r"\1", value).replace("Z", "+00:00")
    try:
        return datetime.fromisoformat(text)
    except ValueError:
        return None
