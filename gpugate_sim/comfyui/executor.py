"""The prompt worker: one prompt at a time, events as execution.py and main.py send them."""

from __future__ import annotations

import asyncio
import logging
import time
import traceback
from pathlib import Path
from typing import Any

import attrs

import gpugate_sim.comfyui.work as work
from gpugate_sim.comfyui.graph import ExecutionList, input_signatures, is_link
from gpugate_sim.comfyui.hub import Hub, preview_frame, preview_with_metadata
from gpugate_sim.comfyui.images import grey_jpeg
from gpugate_sim.comfyui.memory import Part, TorchOutOfMemory, Vram
from gpugate_sim.comfyui.nodes import node_table
from gpugate_sim.comfyui.promptqueue import ExecutionStatus, PromptQueue, QueueItem
from gpugate_sim.comfyui.validation import full_type_name
from gpugate_sim.scenario import ComfyUISpec

log = logging.getLogger(__name__)

OOM_TIPS = (
    "This error means you ran out of memory on your GPU.\n\nTIPS: If the workflow worked "
    "before you might have accidentally set the batch_size to a large number."
)
PREVIEW = grey_jpeg()


class Interrupted(Exception):
    """comfy.model_management.InterruptProcessingException."""


@attrs.define
class Cached:
    outputs: tuple[Any, ...]
    ui: dict[str, Any] | None


class Executor:
    """PromptExecutor plus prompt_worker: runs queue items and owns the node cache."""

    def __init__(
        self,
        spec: ComfyUISpec,
        queue: PromptQueue,
        hub: Hub,
        vram: Vram,
        output_dir: Path,
        temp_dir: Path,
    ) -> None:
        self.spec = spec
        self.queue = queue
        self.hub = hub
        self.vram = vram
        self.output_dir = output_dir
        self.temp_dir = temp_dir
        self.files = {(m.folder, m.name): m.size for m in spec.models}
        self.nodes = node_table(spec.custom_nodes)
        self.cache: dict[str, Cached] = {}
        self.client_id: str | None = None
        self.last_node_id: str | None = None
        self.interrupted = False
        self.success = True
        self.messages: list[tuple[str, dict[str, Any]]] = []
        self.progress: dict[str, dict[str, Any]] = {}
        self.current_inputs: dict[str, Any] = {}
        self.changed = asyncio.Condition()
        """Notified after each prompt and after each round of flags."""

    def interrupt(self) -> None:
        self.interrupted = True

    # -- the worker ----------------------------------------------------------------------------

    async def worker(self) -> None:
        """main.py `prompt_worker`: take an item, run it, record it; flags between prompts."""
        while True:
            got = await self.queue.get()
            if got is not None:
                item, item_id = got
                outputs, meta = await self.execute(item)
                status = ExecutionStatus(
                    "success" if self.success else "error", self.success, self.messages
                )
                self.queue.task_done(item_id, outputs, meta, status)
                if self.client_id is not None:
                    self.hub.send_sync(
                        "executing", {"node": None, "prompt_id": item.prompt_id}, self.client_id
                    )
            flags = self.queue.take_flags()
            free_memory = flags.get("free_memory", False)
            if flags.get("unload_models", free_memory):
                self.vram.unload_all()
            if free_memory:
                self.cache = {}
                self.vram.retain(set())
            async with self.changed:
                self.changed.notify_all()

    # -- one prompt ----------------------------------------------------------------------------

    def add_message(self, event: str, data: dict[str, Any], broadcast: bool) -> None:
        data = {**data, "timestamp": int(time.time() * 1000)}
        self.messages.append((event, data))
        if self.client_id is not None or broadcast:
            self.hub.send_sync(event, data, self.client_id)

    async def execute(self, item: QueueItem) -> tuple[dict[str, Any], dict[str, Any]]:
        """execution.py `execute_async`; returns the history's outputs and meta."""
        self.interrupted = False
        self.client_id = item.client_id if item.has_client_id else None
        self.messages = []
        self.success = True
        prompt_id, prompt = item.prompt_id, item.prompt
        self.add_message("execution_start", {"prompt_id": prompt_id}, broadcast=False)
        self.progress = {}
        signatures = input_signatures(prompt)
        # The classic cache keeps only what this prompt can use; weights nothing references
        # any more are collected, and leave the GPU with them.
        self.cache = {sig: c for sig, c in self.cache.items() if sig in signatures.values()}
        self.vram.retain(_parts(self.cache.values()))
        cached = [node_id for node_id in prompt if signatures.get(node_id) in self.cache]
        self.add_message(
            "execution_cached", {"nodes": cached, "prompt_id": prompt_id}, broadcast=False
        )
        current_outputs = list(cached)
        executed: list[str] = []
        ui_outputs: dict[str, Any] = {}
        meta: dict[str, Any] = {}
        plan = ExecutionList(prompt, set(cached), self.nodes)
        for output in item.outputs:
            plan.add_node(output)
        while (node_id := plan.next()) is not None:
            try:
                await self._execute_node(item, node_id, signatures, executed, ui_outputs, meta)
            except Interrupted:
                self.success = False
                self.add_message(
                    "execution_interrupted",
                    {
                        "prompt_id": prompt_id,
                        "node_id": node_id,
                        "node_type": prompt[node_id]["class_type"],
                        "executed": list(executed),
                    },
                    broadcast=True,
                )
                break
            except Exception as ex:
                self.success = False
                self._report(item, node_id, ex, executed, current_outputs)
                break
            plan.complete(node_id)
        else:
            self.add_message("execution_success", {"prompt_id": prompt_id}, broadcast=False)
        self.last_node_id = None
        if self.spec.disable_smart_memory:
            self.vram.unload_all()
        return ui_outputs, meta

    async def _execute_node(
        self,
        item: QueueItem,
        node_id: str,
        signatures: dict[str, str],
        executed: list[str],
        ui_outputs: dict[str, Any],
        meta: dict[str, Any],
    ) -> None:
        prompt_id, sid = item.prompt_id, self.client_id
        signature = signatures[node_id]
        hit = self.cache.get(signature)
        if hit is not None:
            if sid is not None:
                self.hub.send_sync(
                    "executed",
                    {
                        "node": node_id,
                        "display_node": node_id,
                        "output": hit.ui,
                        "prompt_id": prompt_id,
                    },
                    sid,
                )
            if hit.ui is not None:
                ui_outputs[node_id] = hit.ui
                meta[node_id] = _meta(node_id)
            self._progress(prompt_id, node_id, "finished")
            return
        self._progress(prompt_id, node_id, "running", 0.0, 1.0)
        if sid is not None:
            self.last_node_id = node_id
            self.hub.send_sync(
                "executing", {"node": node_id, "display_node": node_id, "prompt_id": prompt_id}, sid
            )
        self.current_inputs = {}
        self._before_node()
        inputs = self._inputs(item.prompt, node_id, signatures)
        self.current_inputs = inputs

        async def step(value: int, total: int) -> None:
            self._step(item, node_id, value, total)

        run = work.NodeRun(
            node_id,
            self.nodes[item.prompt[node_id]["class_type"]],
            inputs,
            item.prompt,
            item.extra_data,
            self.spec,
            self.vram,
            self.files,
            self.output_dir,
            self.temp_dir,
            step,
        )
        outputs, ui = await work.run(run)
        self.cache[signature] = Cached(outputs, ui)
        if ui is not None:
            ui_outputs[node_id] = ui
            meta[node_id] = _meta(node_id)
            if sid is not None:
                self.hub.send_sync(
                    "executed",
                    {
                        "node": node_id,
                        "display_node": node_id,
                        "output": ui,
                        "prompt_id": prompt_id,
                    },
                    sid,
                )
        self._progress(prompt_id, node_id, "finished")
        executed.append(node_id)

    def _before_node(self) -> None:
        if self.interrupted:
            self.interrupted = False
            raise Interrupted("Processing interrupted")

    def _inputs(self, prompt: dict[str, Any], node_id: str, sigs: dict[str, str]) -> dict[str, Any]:
        values = {}
        for name, value in prompt[node_id]["inputs"].items():
            if is_link(value):
                values[name] = self.cache[sigs[value[0]]].outputs[value[1]]
            else:
                values[name] = value
        return values

    def _step(self, item: QueueItem, node_id: str, value: int, total: int) -> None:
        """The sampler's progress hook: interrupt check, progress, then the preview."""
        self._before_node()
        self._progress(item.prompt_id, node_id, "running", value, total)
        sid = self.client_id
        data = {"value": value, "max": total, "prompt_id": item.prompt_id, "node": node_id}
        self.hub.send_sync("progress", data, sid)
        method = item.extra_data.get("preview_method", self.spec.preview_method)
        if method == "none":
            return
        if self.hub.supports(sid, "supports_preview_metadata"):
            details = {
                "node_id": node_id,
                "prompt_id": item.prompt_id,
                "display_node_id": node_id,
                "parent_node_id": None,
                "real_node_id": node_id,
            }
            self.hub.send_sync(4, preview_with_metadata(PREVIEW, details), sid)
        else:
            self.hub.send_sync(1, preview_frame(PREVIEW), sid)

    def _progress(
        self,
        prompt_id: str,
        node_id: str,
        state: str,
        value: float | None = None,
        total: float | None = None,
    ) -> None:
        entry = self.progress.setdefault(node_id, {"state": "pending", "value": 0.0, "max": 1.0})
        entry["state"] = state
        if total is not None:
            entry["max"] = total
        entry["value"] = entry["max"] if state == "finished" else (value or 0)
        nodes = {
            nid: {
                "value": e["value"],
                "max": e["max"],
                "state": e["state"],
                "node_id": nid,
                "prompt_id": prompt_id,
                "display_node_id": nid,
                "parent_node_id": None,
                "real_node_id": nid,
            }
            for nid, e in self.progress.items()
            if e["state"] != "pending"
        }
        self.hub.send_sync(
            "progress_state", {"prompt_id": prompt_id, "nodes": nodes}, self.client_id
        )

    def _report(
        self,
        item: QueueItem,
        node_id: str,
        ex: Exception,
        executed: list[str],
        current_outputs: list[str],
    ) -> None:
        tips = ""
        if isinstance(ex, TorchOutOfMemory):
            tips = OOM_TIPS
            log.error("Got an OOM, unloading all loaded models.")
            self.vram.unload_all()
        inputs = self.current_inputs
        self.add_message(
            "execution_error",
            {
                "prompt_id": item.prompt_id,
                "node_id": node_id,
                "node_type": item.prompt[node_id]["class_type"],
                "executed": list(executed),
                "exception_message": f"{ex}\n{tips}",
                "exception_type": full_type_name(type(ex)),
                "traceback": traceback.format_tb(ex.__traceback__),
                "current_inputs": {name: [_format_value(v)] for name, v in inputs.items()},
                "current_outputs": list(current_outputs),
            },
            broadcast=False,
        )


def _meta(node_id: str) -> dict[str, Any]:
    return {
        "node_id": node_id,
        "display_node": node_id,
        "parent_node": None,
        "real_node_id": node_id,
    }


def _format_value(value: Any) -> Any:
    if value is None or isinstance(value, int | float | bool | str):
        return value
    return str(value)


def _parts(cached: Any) -> set[Part]:
    """Weights the cached outputs still reference."""
    found: set[Part] = set()
    for entry in cached:
        for value in entry.outputs:
            found.update(getattr(value, "parts", ()))
    return found
