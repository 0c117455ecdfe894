"""`RequestStream`: one request's deltas from the engine core, waiting for its reader.

A reader that has fallen behind (a busy frontend) takes the waiting deltas as one merged
`EngineOutput`, so a slower host does less work per token instead of falling further
behind. A deque and one future: lighter than an `asyncio.Queue` at 256 streams a step.
"""

from __future__ import annotations

import asyncio
import collections

from stator.protocols import EngineOutput


class RequestStream:
    __slots__ = ("cached", "emitted", "items", "prompt_tokens", "waiter")

    def __init__(self, prompt_tokens: int) -> None:
        self.items: collections.deque[EngineOutput | BaseException] = collections.deque()
        self.waiter: asyncio.Future[None] | None = None
        self.prompt_tokens = prompt_tokens
        self.emitted = 0  # tokens delivered so far (an abort's usage)
        self.cached = 0  # prompt tokens the prefix cache served

    def put(self, item: EngineOutput | BaseException) -> None:
        self.items.append(item)
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_result(None)

    async def take(self) -> EngineOutput:
        """The next delta, merged with those waiting behind it; raises a put exception."""
        while not self.items:
            self.waiter = asyncio.get_running_loop().create_future()
            await self.waiter
            self.waiter = None
        first = self.items.popleft()
        if isinstance(first, BaseException):
            raise first
        while self.items and first.finish_reason is None:
            nxt = self.items[0]
            if isinstance(nxt, BaseException) or nxt.prompt_logprobs is not None:
                break
            if (first.logprobs is None) != (nxt.logprobs is None):
                break
            self.items.popleft()
            first.token_ids.extend(nxt.token_ids)
            if first.logprobs is not None and nxt.logprobs is not None:
                first.logprobs.extend(nxt.logprobs)
            first.finish_reason, first.stop_token_id = nxt.finish_reason, nxt.stop_token_id
            first.error, first.error_code = nxt.error, nxt.error_code
            first.usage, first.disagg = nxt.usage, nxt.disagg
        return first
