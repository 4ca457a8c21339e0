"""Whether ComfyUI has the files a prompt's LoadImage family names, asked as a client asks.

ComfyUI 0.3.64 checks them in the nodes' VALIDATE_INPUTS (nodes.py:1700 `LoadImage`, and
LoadImageMask, LoadImageOutput, LoadLatent; LoadAudio, LoadVideo in comfy_extras) with
`folder_paths.exists_annotated_filepath(name)`: `os.path.exists` of the name joined to the
input folder, or to the folder its ` [output]` / ` [input]` / ` [temp]` annotation names.
The gate asks ComfyUI's own `GET /view` the same question (server.py `view_image`: the
file, in that folder and subfolder, is a regular file), as a HEAD so no bytes come back:
200 is there, 404 is not. Whatever `/view` refuses to look at (a name with `..`, a
subfolder outside the folder, an absolute path) is a name the gate cannot judge.

One difference: `os.path.exists` is true of a directory, `/view` finds only files. A
directory named like an image in the input folder makes ComfyUI queue the prompt (and
fail when LoadImage opens it) where the gate answers ComfyUI's refusal for a missing file.
"""

from __future__ import annotations

import asyncio
import posixpath
import urllib.parse
from collections.abc import Mapping
from typing import Any

import aiohttp

from gpugate.runtimes.comfyui.catalog import Catalog

MAX_NAMES = 32
"""Names asked about for one prompt; a prompt naming more is judged by ComfyUI alone."""


def annotated_filepath(name: str) -> tuple[str, str | None]:
    """folder_paths.py `annotated_filepath`: the name without its ` [output]`, ` [input]`
    or ` [temp]` (the character before the bracket is dropped whatever it is), and that
    folder's type; None when the name has no annotation."""
    for folder in ("output", "input", "temp"):
        suffix = f"[{folder}]"
        if name.endswith(suffix):
            return name[: -(len(suffix) + 1)], folder
    return name, None


def named_files(prompt: Mapping[Any, Any], catalog: Catalog) -> list[str]:
    """The names the prompt's file-checked nodes give as literals, each once, in order."""
    names: dict[str, None] = {}
    for node in prompt.values():
        if not isinstance(node, dict):
            continue
        try:
            spec = catalog.get(node.get("class_type"))
        except TypeError:
            continue  # an unhashable class_type: validation answers for it
        inputs = node.get("inputs")
        if spec is None or spec.file_check is None or not isinstance(inputs, dict):
            continue
        value = inputs.get(spec.file_check.input)
        if isinstance(value, dict) and "__value__" in value:
            value = value["__value__"]
        if isinstance(value, str):
            names[value] = None
    return list(names)


def view_query(name: str) -> str | None:
    """The `/view` query that finds the file `exists_annotated_filepath(name)` looks at;
    None when that path is not one `/view` looks at (or the answer needs none)."""
    base, folder = annotated_filepath(name)
    subfolder, filename = posixpath.split(base)
    if not filename or ".." in filename or annotated_filepath(filename)[1] is not None:
        return None
    query = {"filename": filename, "type": folder or "input"}
    if subfolder:
        query["subfolder"] = subfolder
    return urllib.parse.urlencode(query)


async def file_exists(
    session: aiohttp.ClientSession, base_url: str, name: str, timeout: aiohttp.ClientTimeout
) -> bool | None:
    """Whether ComfyUI's file check passes for `name`; None when `/view` cannot say."""
    if annotated_filepath(name)[0] == "":
        return True  # the folder itself, which exists
    query = view_query(name)
    if query is None:
        return None
    async with session.head(f"{base_url}/view?{query}", timeout=timeout) as resp:
        if resp.status == 200:
            return True
        if resp.status == 404:
            return False
        return None


async def files_present(
    session: aiohttp.ClientSession,
    base_url: str,
    names: list[str],
    timeout: aiohttp.ClientTimeout,
) -> dict[str, bool]:
    """What ComfyUI says of each name (at most MAX_NAMES); those it cannot say are left out.
    Raises aiohttp's errors when ComfyUI does not answer."""
    asked = names[:MAX_NAMES]
    answers = await asyncio.gather(*(file_exists(session, base_url, n, timeout) for n in asked))
    return {n: a for n, a in zip(asked, answers, strict=True) if a is not None}
