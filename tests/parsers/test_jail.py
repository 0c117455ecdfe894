"""The hold-back helpers against brute force."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from stator.parsers.jail import find_first, partial_marker_len

MARKERS = ("<think>", "</think>", "<|start|>", "<|end|>", "[TOOL_CALLS]", "<｜tool▁sep｜>")
ALPHABET = st.sampled_from(list("<>/|[]_thinkstarTOLCAS ｜▁x"))


def brute_partial(text: str, markers) -> int:
    sizes = [
        size
        for marker in markers
        for size in range(1, len(marker))
        if len(text) >= size and text.endswith(marker[:size])
    ]
    return max(sizes, default=0)


@given(st.text(ALPHABET, max_size=30), st.lists(st.sampled_from(MARKERS), min_size=1, unique=True))
def test_partial_marker_len_is_the_longest_held_suffix(text, markers):
    assert partial_marker_len(text, tuple(markers)) == brute_partial(text, markers)


@given(st.text(ALPHABET, max_size=30))
def test_find_first_is_the_earliest_marker(text):
    hit = find_first(text, MARKERS)
    positions = [(text.find(m), -len(m), m) for m in MARKERS if m in text]
    if not positions:
        assert hit is None
    else:
        pos, _, marker = min(positions)
        assert hit == (pos, marker)


def test_a_complete_marker_is_not_partial():
    assert partial_marker_len("abc<think>", ("<think>",)) == 0
    assert partial_marker_len("abc<thi", ("<think>",)) == 4
    assert partial_marker_len("", ("<think>",)) == 0
