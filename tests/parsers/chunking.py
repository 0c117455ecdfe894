"""Feeding a parser the same text in different chunkings."""

from __future__ import annotations

import itertools

from hypothesis import strategies as st


@st.composite
def chunkings(draw, text: str) -> list[str]:
    """`text` cut at random places (including between every character, and not at all)."""
    if not text:
        return [text]
    cuts = draw(st.lists(st.integers(min_value=1, max_value=len(text)), max_size=len(text)))
    points = sorted({0, len(text), *cuts})
    return [text[a:b] for a, b in itertools.pairwise(points)]


def every_split_in_two(text: str) -> list[list[str]]:
    return [[text[:i], text[i:]] for i in range(len(text) + 1)]
