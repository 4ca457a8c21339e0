"""Headless Chromium driven over the DevTools protocol (its websocket), for the dashboard test."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import re
import shutil
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
    "--hide-scrollbars",
    "--remote-debugging-port=0",
)


class Page:
    """One page's DevTools session: commands by id, events ignored."""

    def __init__(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        self.ws = ws
        self._id = 0

    async def send(self, method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
        self._id += 1
        ident = self._id
        await self.ws.send_json({"id": ident, "method": method, "params": params or {}})
        async for message in self.ws:
            data = json.loads(message.data)
            if data.get("id") == ident:
                if "error" in data:
                    raise RuntimeError(f"{method}: {data['error']}")
                return data["result"]
        raise ConnectionError("the browser closed the DevTools connection")

    async def evaluate(self, expression: str) -> Any:
        """The JSON value of a JavaScript expression in the page."""
        result = await self.send(
            "Runtime.evaluate", {"expression": expression, "returnByValue": True}
        )
        if "exceptionDetails" in result:
            raise RuntimeError(f"{expression}: {result['exceptionDetails']}")
        return result["result"].get("value")

    async def wait_for(self, expression: str, timeout: float = 20.0) -> bool:
        """Poll an expression until it is truthy in the page (an observer outside it)."""
        async with asyncio.timeout(timeout):
            while True:
                value = await self.evaluate(f"!!({expression})")
                if value:
                    return value
                await asyncio.sleep(0.1)

    async def screenshot(self, path: Path) -> None:
        shot = await self.send("Page.captureScreenshot", {"format": "png"})
        path.write_bytes(base64.b64decode(shot["data"]))


@contextlib.asynccontextmanager
async def chromium_page(
    url: str, profile: Path, width: int = 1280, height: int = 1000
) -> AsyncIterator[Page]:
    """Chromium showing `url`, and a DevTools session on that page."""
    process = await asyncio.create_subprocess_exec(
        CHROMIUM,
        *FLAGS,
        f"--user-data-dir={profile}",
        f"--window-size={width},{height}",
        url,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        assert process.stderr is not None
        endpoint = None
        async with asyncio.timeout(30):
            while endpoint is None:
                line = (await process.stderr.readline()).decode()
                if not line:
                    raise RuntimeError("chromium exited before it listened for DevTools")
                found = re.search(r"DevTools listening on ws://([^/]+)/", line)
                endpoint = found.group(1) if found else None
        # Chromium keeps writing to stderr: drain it so it never blocks on a full pipe.
        drain = asyncio.create_task(process.stderr.read())
        async with aiohttp.ClientSession() as session:
            async with asyncio.timeout(30):
                while True:
                    async with session.get(f"http://{endpoint}/json/list") as resp:
                        targets = await resp.json()
                    pages = [t for t in targets if t["type"] == "page" and t["url"] == url]
                    if pages:
                        break
                    await asyncio.sleep(0.1)
            async with session.ws_connect(pages[0]["webSocketDebuggerUrl"], max_msg_size=0) as ws:
                page = Page(ws)
                await page.send(
                    "Emulation.setDeviceMetricsOverride",
                    {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False},
                )
                yield page
        drain.cancel()
    finally:
        if process.returncode is None:
            process.terminate()
            try:
                await asyncio.wait_for(process.wait(), 10)
            except TimeoutError:
                process.kill()
                await process.wait()
