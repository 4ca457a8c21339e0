"""ComfyUI's PromptQueue: pending prompts as a heap, the running one, history, flags."""

from __future__ import annotations

import asyncio
import copy
import heapq
import itertools
from collections.abc import Callable
from typing import Any

import attrs

MAXIMUM_HISTORY_SIZE = 10000
SENSITIVE_EXTRA_DATA_KEYS = ("auth_token_comfy_org", "api_key_comfy_org")


@attrs.define
class QueueItem:
    """`(number, prompt_id, prompt, extra_data, outputs_to_execute, sensitive)` upstream."""

    number: float
    prompt_id: str
    prompt: dict[str, Any]
    extra_data: dict[str, Any]
    outputs: list[str]
    sensitive: dict[str, Any] = attrs.field(factory=dict)

    def as_json(self) -> list[Any]:
        """The item as /queue and /history show it: the sensitive part left out."""
        return [self.number, self.prompt_id, self.prompt, self.extra_data, self.outputs]

    @property
    def client_id(self) -> str | None:
        return self.extra_data.get("client_id")

    @property
    def has_client_id(self) -> bool:
        return "client_id" in self.extra_data


@attrs.frozen
class ExecutionStatus:
    status_str: str
    completed: bool
    messages: list[tuple[str, dict[str, Any]]]

    def as_json(self) -> dict[str, Any]:
        return {
            "status_str": self.status_str,
            "completed": self.completed,
            "messages": [[event, data] for event, data in self.messages],
        }


class PromptQueue:
    """Pending items ordered by (number, prompt_id); `changed` runs on every queue change."""

    def __init__(self, changed: Callable[[], None]) -> None:
        self._changed = changed
        self._heap: list[tuple[float, str, int, QueueItem]] = []
        self._order = itertools.count()
        self.running: dict[int, QueueItem] = {}
        self.history: dict[str, dict[str, Any]] = {}
        self.flags: dict[str, Any] = {}
        self._wake = asyncio.Event()

    def put(self, item: QueueItem) -> None:
        heapq.heappush(self._heap, (item.number, item.prompt_id, next(self._order), item))
        self._changed()
        self._wake.set()

    async def get(self) -> tuple[QueueItem, int] | None:
        """The next item, or None when woken for flags with nothing queued."""
        while not self._heap:
            if self.flags:
                return None
            self._wake.clear()
            await self._wake.wait()
        _, _, number, item = heapq.heappop(self._heap)
        self.running[number] = item
        self._changed()
        return item, number

    def task_done(
        self, item_id: int, outputs: dict[str, Any], meta: dict[str, Any], status: ExecutionStatus
    ) -> None:
        item = self.running.pop(item_id)
        if len(self.history) > MAXIMUM_HISTORY_SIZE:
            self.history.pop(next(iter(self.history)))
        self.history[item.prompt_id] = {
            "prompt": item.as_json(),
            "outputs": outputs,
            "status": status.as_json(),
            "meta": meta,
        }
        self._changed()

    def tasks_remaining(self) -> int:
        return len(self._heap) + len(self.running)

    def current(self) -> tuple[list[list[Any]], list[list[Any]]]:
        """(running, pending) as GET /queue lists them (pending in heap order, as upstream)."""
        running = [copy.deepcopy(item.as_json()) for item in self.running.values()]
        return running, [copy.deepcopy(entry[3].as_json()) for entry in self._heap]

    def is_running(self, prompt_id: str) -> bool:
        return any(item.prompt_id == prompt_id for item in self.running.values())

    def wipe(self) -> None:
        self._heap = []
        self._changed()

    def delete(self, prompt_id: Any) -> bool:
        for index, entry in enumerate(self._heap):
            if entry[3].prompt_id == prompt_id:
                self._heap.pop(index)
                heapq.heapify(self._heap)
                self._changed()
                return True
        return False

    def get_history(
        self, prompt_id: str | None = None, max_items: int | None = None, offset: int = -1
    ) -> dict[str, Any]:
        if prompt_id is not None:
            entry = self.history.get(prompt_id)
            return {} if entry is None else {prompt_id: copy.deepcopy(entry)}
        out: dict[str, Any] = {}
        if offset < 0 and max_items is not None:
            offset = len(self.history) - max_items
        for i, key in enumerate(self.history):
            if i >= offset:
                out[key] = self.history[key]
                if max_items is not None and len(out) >= max_items:
                    break
        return out

    def wipe_history(self) -> None:
        self.history = {}

    def delete_history_item(self, prompt_id: Any) -> None:
        self.history.pop(prompt_id, None)

    def set_flag(self, name: str, value: Any) -> None:
        self.flags[name] = value
        self._wake.set()

    def take_flags(self) -> dict[str, Any]:
        flags, self.flags = self.flags, {}
        return flags
