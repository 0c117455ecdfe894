"""Holding back text that may be the start of a marker ("jail").

A streamed chunk can end in the middle of a marker (`<thi` of `<think>`). Until the next
chunk decides it, those characters must not reach the client as content. Every parser here
uses the same two helpers so that the rule is written once.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable


def partial_marker_len(text: str, markers: tuple[str, ...]) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of some marker."""
    pattern, longest = _partial_pattern(markers)
    if pattern is None:
        return 0
    match = pattern.search(text, max(0, len(text) - longest + 1))
    return len(text) - match.start() if match else 0


@functools.lru_cache(maxsize=256)
def _partial_pattern(markers: tuple[str, ...]) -> tuple[re.Pattern[str] | None, int]:
    """One regex for "a proper prefix of a marker, at the end": matched in C, on the tail
    only (this runs on every streamed chunk). The leftmost match is the longest suffix."""
    prefixes = {marker[:size] for marker in markers for size in range(1, len(marker))}
    if not prefixes:
        return None, 0
    alternatives = "|".join(re.escape(p) for p in sorted(prefixes, key=len, reverse=True))
    return re.compile(f"(?:{alternatives})\\Z"), max(len(m) for m in markers)


def find_first(text: str, markers: Iterable[str], start: int = 0) -> tuple[int, str] | None:
    """The earliest (position, marker) of any marker in `text[start:]`, longest on ties."""
    found: tuple[int, str] | None = None
    for marker in markers:
        pos = text.find(marker, start)
        if pos < 0:
            continue
        if found is None or pos < found[0] or (pos == found[0] and len(marker) > len(found[1])):
            found = (pos, marker)
    return found
