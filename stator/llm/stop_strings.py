"""`StopStringMatcher`: stop a text stream at the first stop string, without ever showing
the user a piece of one.

Text that might still grow into a stop string (a suffix that is a prefix of one) is held
back until the next chunk settles it. Among several matches the one that *ends* first
wins, because that is the one a character-by-character stream would complete first; this
makes the result independent of how the text was chunked.
"""

from __future__ import annotations

import re
from collections.abc import Iterable


class StopStringMatcher:
    __slots__ = ("_held", "_include", "_max_hold", "_stops", "_suffix", "_tail_chars", "stopped")

    def __init__(self, stops: Iterable[str], include_stop_str: bool = False) -> None:
        self._stops: tuple[str, ...] = tuple(dict.fromkeys(s for s in stops if s))
        self._include = include_stop_str
        # Matches, at the end of the text, any proper prefix of a stop string: what must be
        # held back. `search` finds the leftmost start, i.e. the longest such suffix.
        prefixes = sorted({s[:i] for s in self._stops for i in range(1, len(s))}, key=len)
        self._suffix = (
            re.compile("(?:" + "|".join(map(re.escape, reversed(prefixes))) + r")\Z", re.DOTALL)
            if prefixes
            else None
        )
        self._tail_chars = frozenset(c for s in self._stops for c in s[:-1])
        self._max_hold = max((len(s) - 1 for s in self._stops), default=0)
        self._held = ""
        self.stopped: str | None = None

    def feed(self, text: str) -> tuple[str, str | None]:
        """Add text; return (text safe to emit now, the stop string if one was hit).

        After a stop, everything fed is dropped and the same stop string is returned."""
        if self.stopped is not None:
            return "", self.stopped
        buffer = self._held + text if self._held else text
        for stop in self._stops:
            if stop in buffer:
                return self._stop(buffer)
        # Cheap reject first: a held suffix must end in a character that some stop string
        # has before its last position.
        if buffer and buffer[-1] in self._tail_chars:
            match = self._suffix.search(buffer, max(0, len(buffer) - self._max_hold))
            if match is not None:
                at = match.start()
                self._held = buffer[at:]
                return buffer[:at], None
        self._held = ""
        return buffer, None

    def _stop(self, buffer: str) -> tuple[str, str]:
        start, stop = self._first_match(buffer)
        self._held = ""
        self.stopped = stop
        end = start + len(stop) if self._include else start
        return buffer[:end], stop

    def flush(self) -> str:
        """End of stream without a stop: the held-back text was not a stop after all."""
        held, self._held = self._held, ""
        return held

    def _first_match(self, buffer: str) -> tuple[int, str]:
        best: tuple[int, int, str] | None = None  # (end, start, stop)
        for stop in self._stops:
            start = buffer.find(stop)
            if start < 0:
                continue
            # Same end: the longer stop (earlier start) was completed by the same character.
            key = (start + len(stop), start, stop)
            if best is None or key < best:
                best = key
        assert best is not None  # called only when some stop is in the buffer
        return best[1], best[2]

    def _held_suffix_length(self, buffer: str) -> int:
        if self._suffix is None:
            return 0
        match = self._suffix.search(buffer, max(0, len(buffer) - self._max_hold))
        return len(buffer) - match.start() if match else 0
