"""whisper-server's HTTP side on aiohttp: its routes, cpp-httplib's framing and handlers.

What cpp-httplib (v0.20, bundled with whisper.cpp) adds to the routes of server.cpp, and
what this app reproduces:

* default headers on every response: `Server: whisper.cpp`,
  `Access-Control-Allow-Origin: *`, `Access-Control-Allow-Headers: content-type, authorization`;
* keep-alive: a connection idle for 5 s is closed, and the 100th request on a connection is
  answered with `Connection: close`; other responses carry `Keep-Alive: timeout=5, max=100`;
* the error handler runs on **every** response with status >= 400 (`write_response_core`):
  whisper-server's handler replaces a 400's body with `Invalid request` (text/plain) and
  turns anything else but 500 into 404 `File Not Found (<path>)` — so the JSON 400 bodies
  of server.cpp, its 499 and /health's 503 never reach a client in that form;
* the exception handler: a handler that throws (std::stoi/std::stof on a bad field) answers
  500 `500 Internal Server Error\\n<what()>` (text/plain);
* HEAD is answered by the GET routes, without the body and with `Accept-Ranges: bytes`.

What the handlers print with `printf` goes to stdout, which C buffers in full when it is
not a terminal (`stdio.py`); what they print with `fprintf(stderr, ...)` goes out at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import os
import re
import sys
import time
import weakref
from collections.abc import Awaitable, Callable
from typing import TextIO

import attrs
from aiohttp import web

import gpugate_sim.whisper.transcript as transcript
from gpugate_sim.whisper.audio import AudioError, read_audio
from gpugate_sim.whisper.fields import CppException, InferenceParams, Part, inference_params
from gpugate_sim.whisper.framing import Content, expects_content, httplib_path, read_content
from gpugate_sim.whisper.httplib import header_value
from gpugate_sim.whisper.model import Context, ModelDoesNotFit, ModelMissing, NotAModel
from gpugate_sim.whisper.page import default_content
from gpugate_sim.whisper.record import ACTING, Acting, Route, WhisperRecords

Handler = Callable[[web.BaseRequest, dict[str, Part]], Awaitable[web.StreamResponse]]
EXIT_LOAD_FAILED = 1
LISTENING = "whisper server listening at"
"""The start of the stdout line whisper-server prints once its port is bound."""
DISCONNECT_POLL = 0.01
"""Seconds between checks of the client's connection while decoding (the abort callback)."""
N_THREADS = min(4, os.cpu_count() or 1)
"""whisper_params' default n_threads: min(4, hardware_concurrency)."""
HANDLER = "operator()"
METHODS = frozenset(
    {"GET", "HEAD", "POST", "PUT", "DELETE", "CONNECT", "OPTIONS", "TRACE", "PATCH", "PRI"}
)
"""The methods `Server::parse_request_line` takes (httplib.h L6585)."""
"""`__func__` in the /inference lambda, which starts some of its log lines."""


class ServerState(enum.Enum):
    LOADING_MODEL = "loading model"
    READY = "ready"


@attrs.frozen
class ServerOptions:
    host: str = "127.0.0.1"
    port: int = 8080
    inference_path: str = "/inference"
    request_path: str = ""
    keepalive_timeout: float = 5.0
    keepalive_max: int = 100
    decode_seconds: float = 0.0
    """Fixed decoding time of one request."""
    decode_per_audio_second: float = 0.0
    """Decoding time per second of audio (0.05: 20x real time)."""
    threads: int = N_THREADS
    processors: int = 1


def hard_exit(code: int) -> None:
    """`exit()` from a handler thread: flush stdio and end the process now."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    os._exit(code)


def _content(status: int, body: str, content_type: str) -> web.Response:
    return web.Response(status=status, body=body.encode(), headers={"Content-Type": content_type})


def _json_error(status: int, message: str) -> web.Response:
    return _content(status, '{"error":"' + message + '"}', "application/json")


class WhisperServer:
    """The routes of one whisper-server process over its loaded `Context`."""

    def __init__(
        self,
        context: Context,
        options: ServerOptions,
        *,
        out: TextIO = sys.stdout,
        exit_process: Callable[[int], None] | None = None,
        records: WhisperRecords | None = None,
    ) -> None:
        self.context = context
        self.options = options
        self.records = records
        self.out = out
        self.exit_process = exit_process or hard_exit
        self.state = ServerState.READY
        self.mutex = asyncio.Lock()
        self.requests = 0
        self._served: weakref.WeakKeyDictionary[object, int] = weakref.WeakKeyDictionary()

    def _routes(self) -> list[tuple[str, re.Pattern[str], Handler]]:
        """server.cpp's `svr->Get/Options/Post` patterns: regular expressions, matched whole
        (httplib.h `make_matcher`, `RegexMatcher`), in the order it registers them."""
        base = self.options.request_path
        inference = base + self.options.inference_path
        return [
            ("GET", re.compile(base + "/"), self.index),
            ("OPTIONS", re.compile(inference), self.options_),
            ("POST", re.compile(inference), self.inference),
            ("POST", re.compile(base + "/load"), self.load),
            ("GET", re.compile(base + "/health"), self.health),
        ]

    # -- cpp-httplib's framing -------------------------------------------------------------

    async def handle(self, request: web.BaseRequest) -> web.StreamResponse:
        """One request, through cpp-httplib's framing and routing (listening.py serves it)."""
        path = httplib_path(request.raw_path)
        content = Content()
        if request.method not in METHODS or request.version not in ((1, 0), (1, 1)):
            # parse_request_line: another method or version is a request it cannot parse.
            content = Content(status=400)
        elif expects_content(request):
            if header_value(list(request.raw_headers), b"expect") == b"100-continue":
                # Process_request answers it before any routing, whatever the version.
                await request.writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
            content = await read_content(request)
        try:
            response = await self._route(request, path, content)
        except CppException as exc:
            response = _content(500, f"500 Internal Server Error\n{exc}", "text/plain")
        if response.status >= 400 and isinstance(response, web.Response):
            response = self._error_handler(path, response)
        self._record(request, response.status)
        if request.method == "HEAD":
            response.headers.setdefault("Accept-Ranges", "bytes")
        for name, value in (
            ("Server", "whisper.cpp"),
            ("Access-Control-Allow-Origin", "*"),
            ("Access-Control-Allow-Headers", "content-type, authorization"),
        ):
            response.headers.setdefault(name, value)
        self._count(request, response)
        if content.unread and request.keep_alive and request.protocol is not None:
            # What it never read of the body is the next request on this connection.
            request.protocol.data_received(content.unread)
        return response

    async def _route(self, request: web.BaseRequest, path: str, content: Content) -> web.Response:
        if content.status is not None:
            return _content(content.status, "", "text/plain")
        method = "GET" if request.method == "HEAD" else request.method
        parts = {
            name: Part(bytes(file.content), file.filename.decode("utf-8", "replace"))
            for name, file in content.files.items()
        }
        for verb, pattern, handler in self._routes():
            if verb == method and pattern.fullmatch(path):
                response = await handler(request, parts)
                assert isinstance(response, web.Response)
                return response
        return _content(404, "", "text/plain")

    def _acting(self, request: web.BaseRequest, route: Route) -> Acting:
        """Start the record of a /load or /inference request, as its handler starts."""
        acting = Acting(route, time.time(), request.rel_url.query.get("case", ""))
        request[ACTING] = acting
        return acting

    def _record(self, request: web.BaseRequest, status: int | None) -> None:
        acting: Acting | None = request.get(ACTING)
        if acting is not None and self.records is not None:
            self.records.write(acting.record(status))

    def _error_handler(self, path: str, response: web.Response) -> web.Response:
        if response.status == 400:
            return _content(400, "Invalid request", "text/plain")
        if response.status != 500:
            return _content(404, f"File Not Found ({path})", "text/plain")
        return response

    def _count(self, request: web.BaseRequest, response: web.StreamResponse) -> None:
        """`write_response_core` and the keep-alive loop: the last allowed request and a
        `Connection: close` (exactly, the last such header) say close; HTTP/1.0 without
        `Connection: Keep-Alive` is closed after an answer that says keep-alive."""
        self.requests += 1
        transport = request.transport
        served = 1
        if transport is not None:
            served = self._served.get(transport, 0) + 1
            self._served[transport] = served
        connection = header_value(list(request.raw_headers), b"connection")
        last = served >= self.options.keepalive_max
        if last or connection == b"close":
            response.headers["Connection"] = "close"
            response.force_close()
            return
        timeout = f"{self.options.keepalive_timeout:g}"
        response.headers["Keep-Alive"] = f"timeout={timeout}, max={self.options.keepalive_max}"
        if request.version == (1, 0) and connection != b"Keep-Alive":
            response.force_close()

    # -- routes ----------------------------------------------------------------------------

    async def index(self, request: web.BaseRequest, parts: dict[str, Part]) -> web.StreamResponse:
        path = self.options.request_path + self.options.inference_path
        return _content(200, default_content(self.options.port, path), "text/html")

    async def options_(
        self, request: web.BaseRequest, parts: dict[str, Part]
    ) -> web.StreamResponse:
        return web.Response(status=200)

    async def health(self, request: web.BaseRequest, parts: dict[str, Part]) -> web.StreamResponse:
        if self.state is ServerState.READY:
            return _content(200, '{"status":"ok"}', "application/json")
        return _content(503, '{"status":"loading model"}', "application/json")

    async def inference(
        self, request: web.BaseRequest, parts: dict[str, Part]
    ) -> web.StreamResponse:
        self._acting(request, Route.INFERENCE)
        async with self.mutex:
            if "file" not in parts:
                self._err("error: no 'file' field in the request")
                return _json_error(400, "no 'file' field in the request")
            return await self._transcribe(request, parts)

    async def _transcribe(self, request: web.BaseRequest, parts: dict[str, Part]) -> web.Response:
        audio_part = parts["file"]
        params = inference_params(parts)
        name = audio_part.filename
        self._say(f"Received request: {name}")
        try:
            audio = read_audio(audio_part.content)
        except AudioError as exc:
            self._err(str(exc))
            self._err("error: failed to read audio data")
            return _json_error(400, "failed to read audio data")
        self._say(f"Successfully loaded {name}")
        self._settle_language(params)
        samples = audio.samples_16k
        self._err("")
        self._err(
            f"{HANDLER}: processing '{name}' ({samples} samples, {samples / 16000:.1f} sec), "
            f"{self.options.threads} threads, {self.options.processors} processors, "
            f"lang = {params.language}, "
            f"task = {'translate' if params.translate else 'transcribe'}, "
            f"timestamps = {0 if params.no_timestamps else 1} ..."
        )
        self._err("")
        self._say(f"Running whisper.cpp inference on {name}")
        seconds = self.options.decode_seconds + audio.seconds * self.options.decode_per_audio_second
        if not await self._decode(request, seconds):
            self._err("client disconnected, aborted processing")
            return _json_error(499, "client disconnected")
        result = transcript.transcribe(
            audio,
            language=params.language,
            translate=params.translate,
            detect_only=params.detect_language,
        )
        self._log_decoding(params, samples)
        return self._format(params, result)

    def _settle_language(self, params: InferenceParams) -> None:
        """The handler's checks before decoding: an English-only model, then detection."""
        if not self.context.multilingual and (params.language != "en" or params.translate):
            params.language, params.translate = "en", False
            self._err(
                f"{HANDLER}: WARNING: model is not multilingual, "
                "ignoring language and translation options"
            )
        if params.detect_language:
            params.language = "auto"

    def _log_decoding(self, params: InferenceParams, samples: int) -> None:
        """What whisper_full_with_state logs before it decodes (or instead of decoding)."""
        if params.language in ("auto", "") or params.detect_language:
            probability = transcript.LANGUAGE_PROBABILITIES[transcript.DETECTED]
            self._err(
                f"whisper_full_with_state: auto-detected language: {transcript.DETECTED} "
                f"(p = {probability:f})"
            )
            if params.detect_language:
                return
        if samples < transcript.TOO_SHORT_SAMPLES:
            self._err(
                f"whisper_full_with_state: input is too short - {samples // 160 * 10} ms "
                "< 100 ms. consider padding the input audio with silence"
            )

    def _format(self, params: InferenceParams, result: transcript.Transcript) -> web.Response:
        fmt = params.response_format
        if fmt == "text":
            return _content(200, transcript.format_text(result), "text/html; charset=utf-8")
        if fmt == "srt":
            body = transcript.format_srt(result, params.offset_n)
            return _content(200, body, "application/x-subrip")
        if fmt == "vtt":
            return _content(200, transcript.format_vtt(result), "text/vtt")
        if fmt == "verbose_json":
            body = transcript.format_verbose_json(
                result,
                temperature=params.temperature,
                no_timestamps=params.no_timestamps,
                token_timestamps=params.token_timestamps,
                language_probabilities=not params.no_language_probabilities,
            )
            return _content(200, body, "application/json")
        return _content(200, transcript.format_json(result), "application/json")

    async def _decode(self, request: web.BaseRequest, seconds: float) -> bool:
        """Spend the decoding time; False as soon as the client has gone (abort callback)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + seconds
        while True:
            transport = request.transport
            if transport is None or transport.is_closing():
                return False
            remaining = deadline - loop.time()
            if remaining <= 0:
                return True
            await asyncio.sleep(min(DISCONNECT_POLL, remaining))

    async def load(self, request: web.BaseRequest, parts: dict[str, Part]) -> web.StreamResponse:
        acting = self._acting(request, Route.LOAD)
        async with self.mutex:
            # Set before the checks and not reset by them: a failed /load leaves the
            # server "loading" until a later one succeeds.
            self.state = ServerState.LOADING_MODEL
            if "model" not in parts:
                self._err("error: no 'model' field in the request")
                return _json_error(400, "no 'model' field in the request")
            # A C string to is_file_exist and whisper_init: the path ends at a NUL.
            model = parts["model"].content.split(b"\0", 1)[0].decode("utf-8", "surrogateescape")
            acting.model = model
            # std::ifstream opens it: a FIFO holds the handler there until a writer comes,
            # while /health (no mutex) answers.
            if not await asyncio.to_thread(self.context.catalog.exists, model):
                self._err(f"error: 'model': {model} not found!")
                return _json_error(400, "model not found!")
            self.context.free()
            try:
                await asyncio.to_thread(self.context.init, model)
            except (ModelDoesNotFit, ModelMissing, NotAModel) as exc:
                if isinstance(exc, ModelDoesNotFit):
                    for line in exc.lines:
                        self._err(line)
                self._err("error: model init  failed, no model loaded must exit")
                # The process ends without an answer: the record says so before it does.
                self._record(request, None)
                request.pop(ACTING)
                self.exit_process(EXIT_LOAD_FAILED)
                raise
            self.state = ServerState.READY
            acting.loaded = True
            return _content(200, "Load was successful!", "application/text")

    def _say(self, line: str) -> None:
        # printf: stdout's buffering decides when it is seen.
        self.out.write(line + "\n")

    def _err(self, line: str) -> None:
        self.context.err.write(line + "\n")
        self.context.err.flush()
