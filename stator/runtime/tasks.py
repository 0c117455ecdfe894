"""Stopping background tasks: the one way every part cancels what it started."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterable


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
