"""Holding back text that may be the start of a marker ("jail").

A streamed chunk can end in the middle of a marker (`<thi` of `<think>`). Until the next
chunk decides it, those characters must not reach the client as content. Every parser here
uses the same two helpers so that the rule is written once.
"""

from __future__ import annotations

from collections.abc import Iterable


def partial_marker_len(text: str, markers: Iterable[str]) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of some marker."""
    best = 0
    for marker in markers:
        for size in range(min(len(marker) - 1, len(text)), best, -1):
            if text.endswith(marker[:size]):
                best = size
                break
    return best


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
