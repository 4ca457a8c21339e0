"""A generation relayed to its client: the one loop behind /api/generate, /api/chat and the
OpenAI-compatible completions.

Ollama serves its OpenAI routes through the native handlers: `ChatMiddleware` and
`CompletionsMiddleware` (middleware/openai.go) put a `ChatWriter` or `CompleteWriter` in
front of the gin writer and call `c.Next()`, so both APIs answer the same moments the same
way: tokens as they come (streaming) or collected, a failure before anything was sent with
a real status, one after as a line in the stream, a client gone between two writes the end
of its answer. What each API writes at those moments is its `Answer`.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Protocol

from aiohttp import web

from gpugate_sim.ollama.engine import Finished, GenerationFailed, Token
from gpugate_sim.ollama.wire import stream_write


class Answer(Protocol):
    """How one API writes a generation."""

    stream: bool
    """Tokens go out as they come; else the answer is collected and sent whole."""
    content_type: str

    def token(self, text: str) -> bytes:
        """One streamed token."""
        ...

    def whole(self, text: str, done: Finished) -> web.Response:
        """The collected answer, not streamed."""
        ...

    async def end(
        self, request: web.Request, response: web.StreamResponse | None, done: Finished
    ) -> web.StreamResponse:
        """The stream's closing writes (`response` is None when no token came)."""
        ...

    def refused(self, message: str) -> web.Response:
        """A failure before anything was sent: a status can still say it."""
        ...

    def broken(self, message: str) -> bytes:
        """What a failure writes into a stream already under way."""
        ...


async def relay(
    request: web.Request, events: AsyncIterator[Token | Finished], answer: Answer
) -> web.StreamResponse:
    """Send the engine's `events` (tokens, then Finished) to the client as `answer` writes
    them; closing `events` early, when the client went away, cancels the generation."""
    response: web.StreamResponse | None = None
    collected: list[str] = []
    async with contextlib.aclosing(events):
        try:
            async for event in events:
                if isinstance(event, Token):
                    collected.append(event.text)
                    if answer.stream:
                        response = await stream_write(
                            request, response, answer.content_type, answer.token(event.text)
                        )
                    continue
                if not answer.stream:
                    return answer.whole("".join(collected), event)
                response = await answer.end(request, response, event)
        except GenerationFailed as failure:
            if response is None:
                return answer.refused(failure.message)
            with contextlib.suppress(ConnectionResetError):
                await response.write(answer.broken(failure.message))
        except ConnectionResetError:
            # The client went away between two writes; its answer ends here.
            return response if response is not None else web.Response(status=499)
    assert response is not None
    with contextlib.suppress(ConnectionResetError):
        await response.write_eof()
    return response
