"""`StopStringMatcher`: stop a text stream at the first stop string, without ever showing
the user a piece of one.

Text that might still grow into a stop string (a suffix that is a prefix of one) is held
back until the next chunk settles it. Among several matches the one that *ends* first
wins, because that is the one a character-by-character stream would complete first; this
makes the result independent of how the text was chunked.
"""

from __future__ import annotations

from collections.abc import Iterable


class StopStringMatcher:
    __slots__ = ("_held", "_include", "_max_hold", "_prefixes", "_stops", "stopped")

    def __init__(self, stops: Iterable[str], include_stop_str: bool = False) -> None:
        self._stops: tuple[str, ...] = tuple(dict.fromkeys(s for s in stops if s))
        self._include = include_stop_str
        # Every proper prefix of every stop string: what a held-back suffix may be.
        self._prefixes: frozenset[str] = frozenset(
            s[:i] for s in self._stops for i in range(1, len(s))
        )
        self._max_hold = max((len(s) - 1 for s in self._stops), default=0)
        self._held = ""
        self.stopped: str | None = None

    def feed(self, text: str) -> tuple[str, str | None]:
        """Add text; return (text safe to emit now, the stop string if one was hit).

        After a stop, everything fed is dropped and the same stop string is returned."""
        if self.stopped is not None:
            return "", self.stopped
        if not self._stops:
            return text, None
        buffer = self._held + text
        hit = self._first_match(buffer)
        if hit is not None:
            start, stop = hit
            self._held = ""
            self.stopped = stop
            end = start + len(stop) if self._include else start
            return buffer[:end], stop
        hold = self._held_suffix_length(buffer)
        if hold:
            self._held = buffer[-hold:]
            return buffer[:-hold], None
        self._held = ""
        return buffer, None

    def flush(self) -> str:
        """End of stream without a stop: the held-back text was not a stop after all."""
        held, self._held = self._held, ""
        return held

    def _first_match(self, buffer: str) -> tuple[int, str] | None:
        best: tuple[int, int, str] | None = None  # (end, start, stop)
        for stop in self._stops:
            start = buffer.find(stop)
            if start < 0:
                continue
            # Same end: the longer stop (earlier start) was completed by the same character.
            key = (start + len(stop), start, stop)
            if best is None or key < best:
                best = key
        if best is None:
            return None
        return best[1], best[2]

    def _held_suffix_length(self, buffer: str) -> int:
        prefixes = self._prefixes
        for length in range(min(self._max_hold, len(buffer)), 0, -1):
            if buffer[-length:] in prefixes:
                return length
        return 0
