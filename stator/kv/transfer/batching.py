"""`Batcher`: work that arrives while earlier work of its kind runs waits, and goes on
together as one batch: the decode agent's copies from one prefill pool (one kernel launch
over the union of the pulls' block ids) and its pin checks on one prefill server (one
round trip for every pin).

Issue 15's measurement: 8 pulls of 1k-token prompts enqueued back to back in one process
moved 343 GB/s, but the engine's overlapping pulls only 120: each pull paid its own host
work (the launch on the event loop, a thread to wait in, a round trip of its own on the
one connection to the prefill server) between the copies. Here a batch's host work is
paid once, and up to `depth` batches are in flight at once, so the next batch is staged
and enqueued while the running one copies (the GPU stream keeps them in order).

A batch has two parts: `start(items)` runs on the event loop thread when the batch
leaves (for a copy: enqueue it), `finish(started)` is awaited after (wait for it) and
answers one result or exception per item, so each item succeeds or fails on its own.
An item cancelled before its batch started leaves it; one cancelled after waits for its
batch to end before it raises (a copy still writes its blocks, and the prefill side may
only be told to unpin once it is over).

An item that finds nothing running or pending starts at once, alone (a lone pull loses no
time). Off (`enabled=False`), every item is its own batch, started at once in the caller.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

I = TypeVar("I")  # noqa: E741 (an item)
R = TypeVar("R")  # an item's result


@dataclass
class Batch:
    size: int
    start_seconds: float = 0.0  # host time in `start`
    # Set when the batch is over (results handed out): awaited, never cancelled.
    over: asyncio.Future[None] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future()
    )


@dataclass
class _Entry(Generic[I]):
    item: I
    future: asyncio.Future
    batch: Batch | None = None


class Batcher(Generic[I, R]):
    def __init__(
        self,
        start: Callable[[list[I]], Any],
        finish: Callable[[Any], Awaitable[list[R | BaseException]]],
        *,
        depth: int = 1,
        enabled: bool = True,
    ) -> None:
        if depth < 1:
            raise ValueError(f"batch depth must be at least 1, got {depth}")
        self._start = start
        self._finish = finish
        self.depth = depth
        self.enabled = enabled
        self._pending: list[_Entry[I]] = []
        self._running = 0
        self._scheduled = False
        self._tasks: set[asyncio.Task] = set()
        self.batches = 0  # started, for metrics and tests
        self.items = 0

    async def submit(self, item: I) -> tuple[R, Batch]:
        """This item's result and the batch it went in; raises its exception."""
        loop = asyncio.get_running_loop()
        entry = _Entry(item, loop.create_future())
        if not self.enabled or (self._running == 0 and not self._pending):
            self._run([entry])  # nothing to wait for or to join: no turn of the loop lost
        else:
            self._pending.append(entry)
            self._schedule(loop)
        try:
            return await asyncio.shield(entry.future)
        except asyncio.CancelledError:
            if entry.future.done() and not entry.future.cancelled():
                raise  # the caller was cancelled as the answer came: nothing runs for it
            if entry.batch is None:
                self._pending.remove(entry)  # not started: it leaves the batch
                raise
            await wait_out(entry.batch.over)
            raise

    def _schedule(self, loop: asyncio.AbstractEventLoop) -> None:
        # On the next turn of the loop, not now: items submitted in the same turn (pulls
        # the step's end admitted together) go in one batch. (An item that finds the
        # batcher idle starts at once, alone.)
        if not self._scheduled and self._pending and self._running < self.depth:
            self._scheduled = True
            loop.call_soon(self._next)

    def _next(self) -> None:
        self._scheduled = False
        if not self._pending or self._running >= self.depth:
            return
        entries, self._pending = self._pending, []
        self._run(entries)

    def _run(self, entries: list[_Entry[I]]) -> None:
        loop = asyncio.get_running_loop()
        batch = Batch(len(entries))
        for entry in entries:
            entry.batch = batch
        self.batches += 1
        self.items += len(entries)
        began = time.perf_counter()
        try:
            started = self._start([e.item for e in entries])
        except Exception as exc:
            batch.over.set_result(None)
            for entry in entries:
                _answer(entry, exc, batch)
            self._schedule(loop)
            return
        batch.start_seconds = time.perf_counter() - began
        self._running += 1
        task = loop.create_task(self._end(entries, batch, started))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _end(self, entries: list[_Entry[I]], batch: Batch, started: Any) -> None:
        try:
            results: list[Any] = await self._finish(started)
            if len(results) != len(entries):
                raise RuntimeError(f"{len(results)} results for a batch of {len(entries)}")
        except BaseException as exc:  # the whole batch failed (or the agent closes)
            results = [exc] * len(entries)
            if not isinstance(exc, Exception):
                results = [RuntimeError(f"batch cut: {type(exc).__name__}")] * len(entries)
        finally:
            self._running -= 1
            batch.over.set_result(None)
            self._schedule(asyncio.get_running_loop())
        for entry, result in zip(entries, results, strict=True):
            _answer(entry, result, batch)

    def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()


def _answer(entry: _Entry, result: Any, batch: Batch) -> None:
    if entry.future.done():
        return
    if isinstance(result, BaseException):
        entry.future.set_exception(result)
    else:
        entry.future.set_result((result, batch))


async def wait_out(future: asyncio.Future) -> None:
    """Wait until `future` is done, whatever cancels the waiter meanwhile (the caller
    raises its own CancelledError after)."""
    while not future.done():
        try:
            await asyncio.shield(future)
        except asyncio.CancelledError:
            continue
        except Exception:
            return
