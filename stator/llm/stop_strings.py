"""`StopStringMatcher`: stop a text stream at the first stop string, without ever showing
the user a piece of one.

Text that might still grow into a stop string (a suffix that is a prefix of one) is held
back until the next chunk settles it. Among several matches the one that *ends* first
wins, because that is the one a character-by-character stream would complete first; this
makes the result independent of how the text was chunked.

Matching is an Aho-Corasick automaton over the stop strings: building it is linear in
their total length, and each character of output is looked at once (its state is carried
from chunk to chunk). The automaton's state *is* the held-back text: the longest suffix of
the output that is a prefix of some stop string. An earlier version built every prefix of
every stop string into one regex; a 6,000-character stop took 17.7 s and 1.9 GB.
"""

from __future__ import annotations

from collections.abc import Iterable

# Bounds on what a request may ask for (stator.llm.sampling checks them; vLLM bounds stop
# strings too). The matcher itself is linear in any case.
MAX_STOP_STRINGS = 64
MAX_STOP_STRING_CHARS = 1024


class _Automaton:
    """Trie of the stop strings with failure links. Node 0 is the root."""

    __slots__ = ("depth", "fail", "goto", "out")

    def __init__(self, stops: tuple[str, ...]) -> None:
        self.goto: list[dict[str, int]] = [{}]
        self.depth = [0]
        # The longest stop string that ends at this node (itself, or via failure links).
        self.out: list[str | None] = [None]
        for stop in stops:
            node = 0
            for ch in stop:
                nxt = self.goto[node].get(ch)
                if nxt is None:
                    nxt = len(self.goto)
                    self.goto[node][ch] = nxt
                    self.goto.append({})
                    self.depth.append(self.depth[node] + 1)
                    self.out.append(None)
                node = nxt
            self.out[node] = stop
        self.fail = [0] * len(self.goto)
        queue = list(self.goto[0].values())
        for node in queue:  # breadth first: a node's failure target is shallower
            for ch, child in self.goto[node].items():
                self.fail[child] = self.step(self.fail[node], ch) if node else 0
                if self.out[child] is None:
                    self.out[child] = self.out[self.fail[child]]
                queue.append(child)

    def step(self, node: int, ch: str) -> int:
        goto, fail = self.goto, self.fail
        while True:
            nxt = goto[node].get(ch)
            if nxt is not None:
                return nxt
            if node == 0:
                return 0
            node = fail[node]


class StopStringMatcher:
    __slots__ = ("_auto", "_first", "_held", "_include", "_state", "stopped")

    def __init__(self, stops: Iterable[str], include_stop_str: bool = False) -> None:
        unique = tuple(dict.fromkeys(s for s in stops if s))
        self._auto = _Automaton(unique) if unique else None
        # Characters that can start a stop string: text without any of them while
        # nothing is held skips the automaton.
        self._first = frozenset(s[0] for s in unique)
        self._include = include_stop_str
        self._state = 0
        self._held = ""
        self.stopped: str | None = None

    def feed(self, text: str) -> tuple[str, str | None]:
        """Add text; return (text safe to emit now, the stop string if one was hit).

        After a stop, everything fed is dropped and the same stop string is returned."""
        if self.stopped is not None:
            return "", self.stopped
        auto = self._auto
        if auto is None:
            return text, None
        buffer = self._held + text if self._held else text
        state = self._state
        if state == 0 and self._first.isdisjoint(text):
            return buffer, None
        base = len(self._held)
        step, out = auto.step, auto.out
        for i, ch in enumerate(text):
            state = step(state, ch)
            stop = out[state]
            if stop is not None:
                end = base + i + 1
                self.stopped = stop
                self._held = ""
                self._state = 0
                return buffer[: end if self._include else end - len(stop)], stop
        self._state = state
        keep = auto.depth[state]
        self._held = buffer[len(buffer) - keep :] if keep else ""
        return buffer[: len(buffer) - keep], None

    def flush(self) -> str:
        """End of stream without a stop: the held-back text was not a stop after all."""
        held, self._held = self._held, ""
        self._state = 0
        return held


__all__ = ["MAX_STOP_STRINGS", "MAX_STOP_STRING_CHARS", "StopStringMatcher"]
