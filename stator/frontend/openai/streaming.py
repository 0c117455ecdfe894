"""Server-sent events exactly as OpenAI sends them, and a response that notices a client
going away even while the engine is silent.

`data: {json}\\n\\n` per chunk, `data: [DONE]\\n\\n` last. Starlette's `StreamingResponse`
(with ASGI 2.4 servers such as uvicorn) only notices a disconnect when its next write
fails; `SSEResponse` also listens for `http.disconnect` and cancels the stream at once, so
the engine's request is aborted without waiting for its next token.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TypeVar

import msgspec
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from stator.frontend.errors import ApiError
from stator.frontend.openai.ready_batches import ready_batches

log = logging.getLogger(__name__)
T = TypeVar("T")

DONE = b"data: [DONE]\n\n"
# Where the request-context middleware leaves the raw ASGI send (see `SSEResponse`).
RAW_SEND_KEY = "stator.raw_send"
FIRST_WRITE_EVENTS = 2
_HEADERS = [
    (b"content-type", b"text/event-stream; charset=utf-8"),
    (b"cache-control", b"no-cache"),
    (b"x-accel-buffering", b"no"),
]


def sse(payload: bytes) -> bytes:
    return b"data: " + payload + b"\n\n"


def sse_error(error: ApiError) -> bytes:
    from stator.frontend.openai.objects import to_json

    return sse(to_json(error.body()))


class SSEResponse(Response):
    """An ASGI response streaming `body` (already SSE-framed bytes).

    `on_close(disconnected)` runs once when the stream ends, whether it finished, failed
    or the client left.
    """

    media_type = "text/event-stream"

    def __init__(
        self,
        body: AsyncIterator[bytes],
        on_close: Callable[[bool], None] | None = None,
    ) -> None:
        # Response.__init__ is skipped on purpose: it renders a body we do not have.
        self.body_iterator = body
        self.on_close = on_close
        self.status_code = 200
        self.background = None
        self.raw_headers = list(_HEADERS)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        task = asyncio.current_task()
        assert task is not None
        disconnected = False
        finished = False

        async def watch() -> None:
            nonlocal disconnected
            while True:
                message = await receive()
                if message["type"] == "http.disconnect" and not finished:
                    disconnected = True
                    task.cancel()
                    return

        watcher = asyncio.create_task(watch())
        # Headers go through every middleware (request id, status metrics); body chunks,
        # which nothing above inspects, go to the outermost send that takes them, saving
        # a few coroutine hops per token.
        body_send = scope.get(RAW_SEND_KEY, send)
        # Events that are ready together (a burst of outputs) go out in one write; the
        # first write carries at most the role chunk and the first token (then 8 events,
        # then 32, ...): on a busy frontend many outputs have arrived by the time the
        # request is primed, and the first token must not wait for their processing.
        batches = ready_batches(self.body_iterator, first_items=FIRST_WRITE_EVENTS)
        try:
            # The first events (the role chunk and the primed first token) are ready
            # now: build them before the headers go out, so that the headers and the
            # first token leave back to back instead of one chunk-building apart (the
            # client wakes on the headers; the token must not trail them).
            try:
                first = await anext(batches, None)
            except Exception:
                await send({"type": "http.response.start", "status": 200, "headers": _HEADERS})
                raise
            await send({"type": "http.response.start", "status": 200, "headers": _HEADERS})
            if first is not None:
                chunk = first[0] if len(first) == 1 else b"".join(first)
                await body_send({"type": "http.response.body", "body": chunk, "more_body": True})
            async for batch in batches:
                chunk = batch[0] if len(batch) == 1 else b"".join(batch)
                await body_send({"type": "http.response.body", "body": chunk, "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})
            finished = True
        except asyncio.CancelledError:
            if not disconnected:
                raise
            # Our own cancellation (from `watch`): the client left; that is not an error.
            task.uncancel()
        except OSError:
            # The server failed to write: the client is gone.
            disconnected = True
        finally:
            finished = True
            watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watcher
            # Closing the body closes the engine streams it holds (the worker aborts);
            # `batches` first, which cancels a read it may have left in flight.
            with contextlib.suppress(Exception):
                await batches.aclose()  # type: ignore[attr-defined]
            with contextlib.suppress(Exception):
                await self.body_iterator.aclose()  # type: ignore[attr-defined]
            if self.on_close is not None:
                try:
                    self.on_close(disconnected)
                except Exception:
                    log.exception("stream close callback failed")


class TextChunkTemplate:
    """The SSE bytes of a chunk whose only varying part is one text (in one field, or the
    same text in several: `reasoning_content` and `reasoning`), split once around it: the
    per-token path then JSON-encodes just the text and joins byte strings instead of
    building and encoding a whole chunk object."""

    _MARK = "\x1fstator-text\x1f"

    def __init__(self, build: Callable[[str], object]) -> None:
        from stator.frontend.openai.objects import to_json

        raw = sse(to_json(build(self._MARK)))
        self._parts = raw.split(to_json(self._MARK))

    def render(self, text: str) -> bytes:
        return _encode_str(text).join(self._parts)


_encode_str = msgspec.json.Encoder().encode


class TextChunks:
    """The text-only chunks of one streamed response: one `TextChunkTemplate` per choice,
    split on first use. `build(index, text)` makes choice `index`'s chunk around `text`."""

    def __init__(self, build: Callable[[int, str], object]) -> None:
        self._build = build
        self._templates: dict[int, TextChunkTemplate] = {}

    def render(self, index: int, text: str) -> bytes:
        template = self._templates.get(index)
        if template is None:
            template = TextChunkTemplate(functools.partial(self._build, index))
            self._templates[index] = template
        return template.render(text)


class ClientGone(Exception):
    """The client closed the connection before its (non-streaming) answer was ready."""


async def cancel_on_disconnect(receive: Receive, work: Awaitable[T]) -> T:
    """Await `work`, cancelling it (and with it the engine requests it holds) when the
    client disconnects first; then raise `ClientGone`. The request body must already
    have been read, so the next ASGI message can only be the disconnect.

    `work` runs in the calling task (the watcher cancels that task), not in a task of
    its own: a task would cost two event-loop turns on the way to the first token
    (start it, then resume the caller when it ends), each a full round of every other
    stream's work on a busy frontend."""
    task = asyncio.current_task()
    assert task is not None
    gone = False

    async def watch() -> None:
        nonlocal gone
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                gone = True
                task.cancel()
                return

    watcher = asyncio.create_task(watch())
    try:
        return await work
    except asyncio.CancelledError:
        if not gone:
            raise
        # Our own cancellation (from `watch`): the client left; that is not an error.
        task.uncancel()
        raise ClientGone() from None
    finally:
        # Not awaited: that would cost the request one more event-loop turn on the way
        # to its first token. The watcher only ever waits in `receive()`; cancelled, it
        # ends there on its next step without taking a message.
        watcher.cancel()


def client_gone_response() -> Response:
    """What to "send" when the client already left: nginx's 499, for the logs and the
    requests counter (nobody receives it)."""
    return Response(status_code=499)
