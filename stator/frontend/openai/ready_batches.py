"""Group an async iterator's items into the batches that were ready together.

A streamed response writes one SSE event per output. When a worker's outputs arrive in a
burst (several frames in one socket read: a fast engine, or a busy frontend catching up),
writing each event on its own costs an ASGI `send`, a syscall and a TCP segment per token,
on the server and again on the client. `ready_batches` yields, as one list, every item the
iterator produced *without waiting*, and hands the list out the moment the iterator would
wait, so nothing is held back for later items.

How it tells, without an extra task: it steps the iterator's `__anext__()` by hand. If
the first step finishes, the item was ready. If it yields (it would suspend), the batch so
far goes out first; then `_Resume` passes what the step yielded on to the running task,
exactly as an `await` would, so wake-ups and cancellation behave as usual.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Generator
from typing import Any, TypeVar

T = TypeVar("T")


class _Resume:
    """Await a coroutine that already took a step and yielded `yielded` (or, with `throw`,
    one to throw that exception into first)."""

    __slots__ = ("coro", "throw", "yielded")

    def __init__(self, coro: Any, yielded: Any, throw: BaseException | None = None) -> None:
        self.coro = coro
        self.yielded = yielded
        self.throw = throw

    def __await__(self) -> Generator[Any, Any, Any]:
        yielded, exc, sent = self.yielded, self.throw, None
        while True:
            if exc is None:
                try:
                    sent = yield yielded
                except BaseException as thrown:  # cancellation included: the coroutine decides
                    exc = thrown
            try:
                yielded = self.coro.send(sent) if exc is None else self.coro.throw(exc)
            except StopIteration as stop:
                return stop.value
            exc = None


async def _cancel(step: Any) -> None:
    """Cancel a step left in flight, as a task cancellation would, and let it clean up."""
    with contextlib.suppress(asyncio.CancelledError, StopAsyncIteration):
        await _Resume(step, None, throw=asyncio.CancelledError())


_RAMP = 4  # with `first_items`, each batch may hold this many times the previous one's limit


async def ready_batches(
    iterator: AsyncIterator[T], max_items: int = 64, first_items: int | None = None
) -> AsyncIterator[list[T]]:
    """Lists of the items of `iterator` that were ready together, at most `max_items`
    each (so an iterator that never waits still streams).

    `first_items`: the first batch holds at most this many, the next ones 4× more each,
    up to `max_items`. For a stream whose first items matter most (a response's first
    token): when many items are ready at once, the first go out before the iterator
    produces the rest, instead of after it."""
    batch: list[T] = []
    limit = min(first_items or max_items, max_items)
    while True:
        step: Any = iterator.__anext__()
        try:
            yielded = step.send(None)
        except StopIteration as stop:  # ready without waiting
            batch.append(stop.value)
            if len(batch) >= limit:
                yield batch
                batch = []
                limit = min(limit * _RAMP, max_items)
            continue
        except StopAsyncIteration:
            break
        if batch:  # it would wait: hand out what is ready first
            try:
                yield batch
            except BaseException:  # the consumer stopped (closed us, or was cancelled)
                await _cancel(step)
                raise
            batch = []
            limit = min(limit * _RAMP, max_items)
        try:
            batch.append(await _Resume(step, yielded))
        except StopAsyncIteration:
            break
    if batch:
        yield batch
