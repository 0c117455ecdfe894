"""Progress callbacks for the benchmark's live bar, kept cheap on the hot path.

The runner reports every finished request. Handing each one to rich's `Progress` takes
its lock and updates its speed estimate; at thousands of requests a second that is CPU
the client would spend in the middle of the measurement. `Batched` adds requests up and
passes them on at most every `interval` seconds (the bar redraws twice a second anyway).
"""

from __future__ import annotations

import time
from collections.abc import Callable


class Batched:
    """Calls `advance(n)` with the requests counted since the last call, at most once per
    `interval` seconds; `flush()` passes on what is left (call it at the end)."""

    __slots__ = ("_advance", "_clock", "_interval", "_next", "_pending")

    def __init__(
        self,
        advance: Callable[[int], None],
        interval: float = 0.25,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._advance, self._interval, self._clock = advance, interval, clock
        self._pending = 0
        self._next = clock() + interval

    def __call__(self, n: int) -> None:
        self._pending += n
        now = self._clock()
        if now >= self._next:
            self._next = now + self._interval
            self.flush()

    def flush(self) -> None:
        if self._pending:
            pending, self._pending = self._pending, 0
            self._advance(pending)
