"""The PromptServer's HTTP routes, answered as ComfyUI's server.py answers them.

Handlers read bodies with `request.json()` as upstream does, so a body that is not JSON
(or not the expected shape) raises into aiohttp's own 500 (text/plain, Connection: close).
"""

from __future__ import annotations

import hashlib
import mimetypes
import os
import sys
import tempfile
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

from aiohttp import web

import gpugate.sim.comfyui.catalog as catalog
from gpugate.sim.comfyui.executor import Executor
from gpugate.sim.comfyui.hub import Hub
from gpugate.sim.comfyui.nodes import MODEL_FOLDERS, NodeDef
from gpugate.sim.comfyui.promptqueue import SENSITIVE_EXTRA_DATA_KEYS, PromptQueue, QueueItem
from gpugate.sim.comfyui.record import PromptRecords, answer_recorded
from gpugate.sim.comfyui.validation import validate_prompt
from gpugate.sim.comfyui.webui import INDEX_HTML


class SimComfyUI(Protocol):
    """What the routes read of the simulated ComfyUI (`server.SimComfyUI`)."""

    output_dir: Path
    input_dir: Path
    temp_dir: Path
    client_max_size: int
    server_features: dict[str, Any]
    hub: Hub
    queue: PromptQueue
    executor: Executor
    prompt_records: PromptRecords | None
    nodes: Mapping[str, NodeDef]

    def queue_info(self) -> dict[str, Any]: ...

    def exists(self, name: str) -> bool: ...

    def files(self, folder: str) -> list[str]: ...

    def file_lists(self) -> dict[str, list[str]]: ...


FORCE_DOWNLOAD = {
    "text/html",
    "text/html-sandboxed",
    "application/xhtml+xml",
    "text/javascript",
    "text/css",
}
UPLOAD_CHUNK = 256 * 1024


class Routes:
    """Route handlers bound to one simulated ComfyUI."""

    def __init__(self, sim: SimComfyUI) -> None:
        self.sim = sim

    def table(self) -> list[web.RouteDef]:
        """Every route, also under /api (upstream's `add_routes`)."""
        routes = [
            web.get("/ws", self.websocket),
            web.get("/", self.root),
            web.get("/embeddings", self.embeddings),
            web.get("/models", self.model_types),
            web.get("/models/{folder}", self.models),
            web.get("/extensions", self.extensions),
            web.get("/features", self.features),
            web.get("/object_info", self.object_info),
            web.get("/object_info/{node_class}", self.object_info_node),
            web.post("/upload/image", self.upload_image),
            web.get("/view", self.view),
            web.get("/system_stats", self.system_stats),
            web.get("/prompt", self.get_prompt),
            web.post("/prompt", self.post_prompt),
            web.get("/queue", self.get_queue),
            web.post("/queue", self.post_queue),
            web.get("/history", self.get_history),
            web.get("/history/{prompt_id}", self.get_history_item),
            web.post("/history", self.post_history),
            web.post("/interrupt", self.interrupt),
            web.post("/free", self.free),
        ]
        api = [web.route(r.method, "/api" + r.path, r.handler) for r in routes]
        return api + routes

    # -- pages and lists -----------------------------------------------------------------------

    async def websocket(self, request: web.Request) -> web.StreamResponse:
        executor = self.sim.executor
        executing = (executor.client_id, executor.last_node_id)
        return await self.sim.hub.handle(request, self.sim.queue_info(), executing)

    async def root(self, request: web.Request) -> web.StreamResponse:
        headers = {"Cache-Control": "no-cache", "Pragma": "no-cache", "Expires": "0"}
        return web.Response(text=INDEX_HTML, content_type="text/html", headers=headers)

    async def embeddings(self, request: web.Request) -> web.StreamResponse:
        return web.json_response([os.path.splitext(n)[0] for n in self.sim.files("embeddings")])

    async def model_types(self, request: web.Request) -> web.StreamResponse:
        return web.json_response(list(MODEL_FOLDERS))

    async def models(self, request: web.Request) -> web.StreamResponse:
        folder = request.match_info["folder"]
        if folder not in MODEL_FOLDERS:
            return web.Response(status=404)
        return web.json_response(self.sim.files(folder))

    async def extensions(self, request: web.Request) -> web.StreamResponse:
        return web.json_response([])

    async def features(self, request: web.Request) -> web.StreamResponse:
        return web.json_response(self.sim.server_features)

    async def object_info(self, request: web.Request) -> web.StreamResponse:
        # The folders are listed anew for every answer, as get_filename_list re-lists them.
        return web.json_response(catalog.object_info(self.sim.file_lists(), self.sim.nodes))

    async def object_info_node(self, request: web.Request) -> web.StreamResponse:
        name = request.match_info["node_class"]
        return web.json_response(
            catalog.object_info_node(name, self.sim.file_lists(), self.sim.nodes)
        )

    async def system_stats(self, request: web.Request) -> web.StreamResponse:
        sim = self.sim
        state = sim.gpu.read()
        device = state.device(sim.device)
        ram_total, ram_free = _meminfo()
        stats = {
            "system": {
                "os": sys.platform,
                "ram_total": ram_total,
                "ram_free": ram_free,
                "comfyui_version": sim.spec.version,
                "required_frontend_version": "1.27.10",
                "installed_templates_version": "0.1.94",
                "required_templates_version": "0.1.94",
                "python_version": sys.version,
                "pytorch_version": "2.8.0+cu128",
                "embedded_python": False,
                "argv": sim.argv[1:],
            },
            "devices": [
                {
                    # PyTorch's device: ordinal 0 of the GPUs it sees, whichever card.
                    "name": f"cuda:0 {device.name} : cudaMallocAsync",
                    "type": "cuda",
                    "index": 0,
                    "vram_total": device.total,
                    "vram_free": state.free(sim.device),
                    "torch_vram_total": sim.vram.torch_reserved,
                    "torch_vram_free": 0,
                }
            ],
        }
        return web.json_response(stats)

    # -- the queue -----------------------------------------------------------------------------

    async def get_prompt(self, request: web.Request) -> web.StreamResponse:
        return web.json_response(self.sim.queue_info())

    async def post_prompt(self, request: web.Request) -> web.StreamResponse:
        """POST /prompt, recorded (with `comfyui.record`) before the answer is sent."""
        return await answer_recorded(self.sim.prompt_records, request, self._post_prompt)

    async def _post_prompt(self, request: web.Request, queued: list[str]) -> web.StreamResponse:
        sim = self.sim
        json_data = await request.json()
        if "number" in json_data:
            number: float = float(json_data["number"])
        else:
            number = sim.number
            if "front" in json_data and json_data["front"]:  # noqa: RUF019 (a list body too)
                number = -number
            sim.number += 1
        if "prompt" not in json_data:
            error = {
                "type": "no_prompt",
                "message": "No prompt provided",
                "details": "No prompt provided",
                "extra_info": {},
            }
            return web.json_response({"error": error, "node_errors": {}}, status=400)
        prompt = json_data["prompt"]
        prompt_id = str(json_data.get("prompt_id", uuid.uuid4()))
        valid = validate_prompt(
            prompt,
            sim.file_lists(),
            json_data.get("partial_execution_targets"),
            nodes=sim.nodes,
            exists=sim.exists,
        )
        extra_data = json_data.get("extra_data", {})
        if "client_id" in json_data:
            extra_data["client_id"] = json_data["client_id"]
        if not valid.valid:
            return web.json_response(
                {"error": valid.error, "node_errors": valid.node_errors}, status=400
            )
        sensitive = {k: extra_data.pop(k) for k in SENSITIVE_EXTRA_DATA_KEYS if k in extra_data}
        sim.queue.put(QueueItem(number, prompt_id, prompt, extra_data, valid.outputs, sensitive))
        queued.append(prompt_id)
        return web.json_response(
            {"prompt_id": prompt_id, "number": number, "node_errors": valid.node_errors}
        )

    async def get_queue(self, request: web.Request) -> web.StreamResponse:
        running, pending = self.sim.queue.current()
        return web.json_response({"queue_running": running, "queue_pending": pending})

    async def post_queue(self, request: web.Request) -> web.StreamResponse:
        json_data = await request.json()
        if "clear" in json_data and json_data["clear"]:  # noqa: RUF019 (a list body too)
            self.sim.queue.wipe()
        if "delete" in json_data:
            for prompt_id in json_data["delete"]:
                self.sim.queue.delete(prompt_id)
        return web.Response(status=200)

    async def get_history(self, request: web.Request) -> web.StreamResponse:
        query = request.rel_url.query
        max_items = int(query["max_items"]) if "max_items" in query else None
        offset = int(query["offset"]) if "offset" in query else -1
        return web.json_response(self.sim.queue.get_history(max_items=max_items, offset=offset))

    async def get_history_item(self, request: web.Request) -> web.StreamResponse:
        prompt_id = request.match_info["prompt_id"]
        return web.json_response(self.sim.queue.get_history(prompt_id=prompt_id))

    async def post_history(self, request: web.Request) -> web.StreamResponse:
        json_data = await request.json()
        if "clear" in json_data and json_data["clear"]:  # noqa: RUF019 (a list body too)
            self.sim.queue.wipe_history()
        if "delete" in json_data:
            for prompt_id in json_data["delete"]:
                self.sim.queue.delete_history_item(prompt_id)
        return web.Response(status=200)

    async def interrupt(self, request: web.Request) -> web.StreamResponse:
        try:
            json_data = await request.json()
        except ValueError:
            json_data = {}
        prompt_id = json_data.get("prompt_id")
        # A targeted interrupt acts only on the running prompt; a global one always.
        if not prompt_id or self.sim.queue.is_running(prompt_id):
            self.sim.executor.interrupt()
        return web.Response(status=200)

    async def free(self, request: web.Request) -> web.StreamResponse:
        json_data = await request.json()
        unload_models = json_data.get("unload_models", False)
        free_memory = json_data.get("free_memory", False)
        if unload_models:
            self.sim.queue.set_flag("unload_models", unload_models)
        if free_memory:
            self.sim.queue.set_flag("free_memory", free_memory)
        return web.Response(status=200)

    # -- files ---------------------------------------------------------------------------------

    def _directory(self, kind: str | None) -> Path | None:
        return {
            "output": self.sim.output_dir,
            "input": self.sim.input_dir,
            "temp": self.sim.temp_dir,
        }.get(kind or "")

    async def view(self, request: web.Request) -> web.StreamResponse:
        query = request.rel_url.query
        if "filename" not in query:
            return web.Response(status=404)
        filename, output_dir = _annotated(query["filename"], self)
        if filename[0] == "/" or ".." in filename:
            return web.Response(status=400)
        if output_dir is None:
            output_dir = self._directory(query.get("type", "output"))
        if output_dir is None:
            return web.Response(status=400)
        root = str(output_dir)
        if "subfolder" in query:
            full = os.path.join(root, query["subfolder"])
            if os.path.commonpath((os.path.abspath(full), root)) != root:
                return web.Response(status=403)
            root = full
        filename = os.path.basename(filename)
        path = os.path.join(root, filename)
        if not os.path.isfile(path):
            return web.Response(status=404)
        content_type = mimetypes.guess_type(filename)[0] or "application/octet-stream"
        if content_type in FORCE_DOWNLOAD:
            content_type = "application/octet-stream"
        return web.FileResponse(
            path,
            headers={"Content-Disposition": f'filename="{filename}"', "Content-Type": content_type},
        )

    async def upload_image(self, request: web.Request) -> web.StreamResponse:
        """Multipart upload, streamed to disk (upstream buffers; the answer is the same)."""
        limit = self.sim.client_max_size
        fields: dict[str, str] = {}
        upload: tuple[str, Path, str] | None = None
        received = 0
        reader = await request.multipart()
        staging = Path(tempfile.mkdtemp(prefix=".upload-", dir=self.sim.input_dir))
        try:
            while (part := await reader.next()) is not None:
                if part.name == "image" and part.filename is not None and upload is None:  # type: ignore[union-attr]
                    target = staging / "data"
                    digest = hashlib.sha256()
                    with open(target, "wb") as fh:
                        while chunk := await part.read_chunk(UPLOAD_CHUNK):  # type: ignore[union-attr]
                            received += len(chunk)
                            if received > limit:
                                raise web.HTTPRequestEntityTooLarge(limit, received)
                            digest.update(chunk)
                            fh.write(chunk)
                    upload = (part.filename, target, digest.hexdigest())  # type: ignore[union-attr]
                else:
                    text = await part.text()  # type: ignore[union-attr]
                    received += len(text)
                    fields.setdefault(str(part.name), text)
            return self._store_upload(upload, fields)
        finally:
            for leftover in staging.iterdir():
                leftover.unlink()
            staging.rmdir()

    def _store_upload(
        self, upload: tuple[str, Path, str] | None, fields: dict[str, str]
    ) -> web.StreamResponse:
        kind = fields.get("type") or "input"
        upload_dir = self._directory(kind)
        if upload_dir is None:
            # Upstream's get_dir_by_type leaves its result unbound here: a 500.
            raise UnboundLocalError(f"unknown upload type {kind!r}")
        if upload is None:
            return web.Response(status=400)
        filename, data, digest = upload
        if not filename:
            return web.Response(status=400)
        subfolder = fields.get("subfolder", "")
        folder = os.path.join(str(upload_dir), os.path.normpath(subfolder))
        filepath = os.path.abspath(os.path.join(folder, filename))
        if os.path.commonpath((str(upload_dir), filepath)) != str(upload_dir):
            return web.Response(status=400)
        os.makedirs(folder, exist_ok=True)
        stem, ext = os.path.splitext(filename)
        duplicate = False
        if fields.get("overwrite") not in ("true", "1"):
            i = 1
            while os.path.exists(filepath):
                if _sha256(filepath) == digest:
                    duplicate = True
                    break
                filename = f"{stem} ({i}){ext}"
                filepath = os.path.join(folder, filename)
                i += 1
        if not duplicate:
            os.replace(data, filepath)
        return web.json_response({"name": filename, "subfolder": subfolder, "type": kind})


def _annotated(name: str, routes: Routes) -> tuple[str, Path | None]:
    """`name [output]` style annotations choose the directory."""
    for kind in ("output", "input", "temp"):
        if name.endswith(f" [{kind}]"):
            return name[: -len(kind) - 3], routes._directory(kind)
    return name, None


def _sha256(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def _meminfo() -> tuple[int, int]:
    values: dict[str, int] = {}
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            key, _, rest = line.partition(":")
            values[key] = int(rest.split()[0]) * 1024
    except (OSError, ValueError, IndexError):
        return 0, 0
    return values.get("MemTotal", 0), values.get("MemAvailable", 0)
