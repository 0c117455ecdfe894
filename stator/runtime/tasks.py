"""Stopping background tasks: the one way every part cancels what it started."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Iterable
from typing import Any


async def cancel_and_wait(tasks: Iterable[asyncio.Task | None]) -> None:
    """Cancel every task (None entries skipped), then wait for each to end. A task's own
    error is dropped: it is being stopped, and whatever it raised while stopping must not
    keep the caller from stopping the rest."""
    pending = [task for task in tasks if task is not None]
    for task in pending:
        task.cancel()
    for task in pending:
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await task


async def close_built(task: asyncio.Task | None, close: Callable[[Any], Awaitable[None]]) -> None:
    """Stop a task that builds something (cancelled if still building) and close what it
    built. Errors are dropped, as in `cancel_and_wait`: the owner is going away."""
    if task is None:
        return
    if not task.done():
        task.cancel()
    with contextlib.suppress(asyncio.CancelledError, Exception):
        await close(await task)
