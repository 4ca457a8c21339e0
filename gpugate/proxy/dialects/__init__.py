"""Each HTTP server a runtime is built on, as the listener speaks it (base.py: the interface).

`dialect_of` maps a runtime's `ServerDialect` to the object that reads and answers as that
server does: Go's net/http (go.py), aiohttp's server with ComfyUI's settings (aiohttp.py),
cpp-httplib 0.58 as llama-server builds it and 0.20 as whisper-server does (httplib.py),
uvicorn's httptools protocol as vLLM runs it (uvicorn.py).
"""

from __future__ import annotations

from gpugate.proxy.dialects import aiohttp, go, httplib, uvicorn
from gpugate.proxy.dialects.base import HttpDialect
from gpugate.runtimes.dialect import ServerDialect

DIALECTS: dict[ServerDialect, HttpDialect] = {
    ServerDialect.GO: go.DIALECT,
    ServerDialect.AIOHTTP: aiohttp.DIALECT,
    ServerDialect.HTTPLIB: httplib.DIALECT,
    ServerDialect.HTTPLIB_0_20: httplib.WHISPER,
    ServerDialect.UVICORN: uvicorn.DIALECT,
}


def dialect_of(server: ServerDialect) -> HttpDialect:
    """The reading and answers of the server a runtime is built on."""
    return DIALECTS[server]
