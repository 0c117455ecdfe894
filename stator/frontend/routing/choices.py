"""`ChoiceStream`: one choice of a response on its way back from the workers, its engine
outputs run through the processor's `OutputProcessor` into `Delta`s.

`prime()` waits for the first delta so routing failures (no worker, overloaded) become
HTTP errors before a streaming response has started. Closing a stream closes its engine
stream, which cancels the request on the worker. `merged_deltas` interleaves a request's
choices as their deltas come.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from typing import Any

from stator.frontend import errors
from stator.frontend.metrics import FrontendMetrics
from stator.frontend.routing.hints import WORKER_HEADER
from stator.llm import Delta
from stator.protocols import EngineOutput, EngineRequest
from stator.router import BadRouting, Overloaded
from stator.runtime import Migratable, NoInstances, RemoteError

log = logging.getLogger(__name__)


class EngineFailed(Exception):
    """The worker reported an error for this choice; `code` is its
    `EngineOutput.error_code` (`INVALID_REQUEST`: the engine refused the request)."""

    def __init__(self, message: str, code: str | None = None) -> None:
        super().__init__(message)
        self.code = code


class ChoiceStream:
    """`output`: the processor's `OutputProcessor` of this choice. `keep_token_deltas`:
    pass on deltas whose tokens decode to no text (Harmony's special tokens, which its
    parser reads)."""

    def __init__(
        self,
        index: int,
        request: EngineRequest,
        output: Any,
        outputs: AsyncIterator[EngineOutput],
        metrics: FrontendMetrics,
        keep_token_deltas: bool = False,
    ) -> None:
        self.index = index
        self.request = request
        self.output = output
        self.metrics = metrics
        shape = request.prompt_embeds_shape
        self.prompt_tokens = len(request.token_ids) if shape is None else shape[0]
        self.detokenize_seconds = 0.0
        self._outputs = outputs
        self._first: Delta | None = None
        self._started = False
        self._done = False
        self._keep_token_deltas = keep_token_deltas

    async def prime(self) -> None:
        started = time.perf_counter()
        try:
            self._first = await self._next_delta()
        except NoInstances as exc:
            raise errors.no_workers(self.request.model) from exc
        except Overloaded as exc:
            raise errors.overloaded(str(exc), exc.retry_after) from exc
        except BadRouting as exc:
            raise errors.bad_request(str(exc), param=WORKER_HEADER) from exc
        except Migratable as exc:
            raise errors.no_workers(self.request.model) from exc
        except EngineFailed as exc:
            raise errors.engine_failed_from(exc) from exc
        finally:
            # Time to route and get the first output back (prefill included).
            self.metrics.stage_timers["route"].observe(time.perf_counter() - started)

    async def _next_delta(self) -> Delta:
        """The next delta with something in it (text, tokens or a finish reason)."""
        try:
            return await self._read_delta()
        except RemoteError as exc:
            raise EngineFailed(str(exc)) from exc
        except Migratable as exc:
            if not self._started:
                raise  # before any output: no worker could take it (503 in `prime`)
            raise EngineFailed(f"the worker was lost mid-stream: {exc}") from exc

    async def _read_delta(self) -> Delta:
        async for output in self._outputs:
            self._started = True
            if output.finish_reason == "error":
                raise EngineFailed(output.error or "engine error", output.error_code)
            started = time.perf_counter()
            delta = self.output.process(output)
            self.detokenize_seconds += time.perf_counter() - started
            if delta.text or delta.finish_reason or delta.logprobs:
                return delta
            if self._keep_token_deltas and delta.token_ids:
                return delta
        raise EngineFailed("the engine stream ended without a finish reason")

    @property
    def completion_tokens(self) -> int:
        return self.output.completion_tokens

    @property
    def cached_tokens(self) -> int:
        return self.output.cached_tokens

    async def deltas(self) -> AsyncIterator[Delta]:
        """Every delta of this choice, the primed one first; ends at the finish."""
        try:
            delta = self._first if self._first is not None else await self._next_delta()
            self._first = None
            while True:
                yield delta
                if delta.finish_reason is not None:
                    return
                delta = await self._next_delta()
        finally:
            await self.aclose()

    async def aclose(self) -> None:
        if self._done:
            return
        self._done = True
        # Closing the generator cancels the request on the worker (a stop string matched
        # early, the client went away, or a sibling choice failed).
        await self._outputs.aclose()
        self.metrics.stage_timers["detokenize"].observe(self.detokenize_seconds)


async def prime_all(streams: list[ChoiceStream]) -> None:
    """Prime every choice concurrently; on any failure close them all and re-raise."""
    try:
        if len(streams) == 1:
            await streams[0].prime()
        else:
            await asyncio.gather(*(s.prime() for s in streams))
    except BaseException:
        await close_all(streams)
        raise


async def close_all(streams: list[ChoiceStream]) -> None:
    for stream in streams:
        try:
            await stream.aclose()
        except Exception:
            log.exception("closing choice %d failed", stream.index)


async def merged_deltas(streams: list[ChoiceStream]) -> AsyncIterator[tuple[int, Delta]]:
    """(choice index, delta) from every choice as they come. One choice is iterated
    directly: no task or queue on the common path."""
    if len(streams) == 1:
        stream = streams[0]
        async for delta in stream.deltas():
            yield stream.index, delta
        return
    queue: asyncio.Queue[tuple[int, Delta] | BaseException | None] = asyncio.Queue()

    async def pump(stream: ChoiceStream) -> None:
        try:
            async for delta in stream.deltas():
                queue.put_nowait((stream.index, delta))
            queue.put_nowait(None)
        except Exception as exc:
            queue.put_nowait(exc)

    tasks = [asyncio.create_task(pump(s)) for s in streams]
    try:
        remaining = len(tasks)
        while remaining:
            item = await queue.get()
            if item is None:
                remaining -= 1
            elif isinstance(item, BaseException):
                raise item
            else:
                yield item
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await close_all(streams)
