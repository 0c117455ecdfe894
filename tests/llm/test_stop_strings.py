from __future__ import annotations

import itertools

from hypothesis import given, settings
from hypothesis import strategies as st

from stator.llm.stop_strings import StopStringMatcher

ALPHABET = st.sampled_from([*list("ab c"), "你", "🎉"])
TEXT = st.text(ALPHABET, max_size=40)
STOPS = st.lists(st.text(ALPHABET, min_size=1, max_size=4), min_size=1, max_size=4)
CUTS = st.lists(st.integers(0, 100), max_size=15)


def chunks(text: str, cuts: list[int]) -> list[str]:
    points = sorted({c % (len(text) + 1) for c in cuts} | {0, len(text)})
    return [text[a:b] for a, b in itertools.pairwise(points)]


def run(matcher: StopStringMatcher, parts: list[str]) -> tuple[str, str | None]:
    out = []
    for part in parts:
        emit, stopped = matcher.feed(part)
        out.append(emit)
        if stopped is not None:
            return "".join(out), stopped
    return "".join(out) + matcher.flush(), None


def reference(text: str, stops: list[str], include: bool) -> tuple[str, str | None]:
    """Character by character: the first position where some stop string is complete."""
    for end in range(1, len(text) + 1):
        done = [s for s in stops if text[:end].endswith(s)]
        if done:
            stop = max(done, key=len)
            cut = end if include else end - len(stop)
            return text[:cut], stop
    return text, None


@settings(max_examples=400, deadline=None)
@given(text=TEXT, stops=STOPS, cuts=CUTS, include=st.booleans())
def test_chunked_equals_character_by_character(text, stops, cuts, include):
    got = run(StopStringMatcher(stops, include_stop_str=include), chunks(text, cuts))
    assert got == reference(text, stops, include)


@settings(max_examples=300, deadline=None)
@given(text=TEXT, stops=STOPS, cuts=CUTS)
def test_stop_strings_never_leak(text, stops, cuts):
    matcher = StopStringMatcher(stops)
    emitted = ""
    for part in chunks(text, cuts):
        emit, stopped = matcher.feed(part)
        emitted += emit
        # At every moment the user has seen, no stop string is visible.
        assert not any(s in emitted for s in stops)
        if stopped:
            break
    assert text.startswith(emitted)


def test_holds_back_a_possible_stop_then_releases_it():
    m = StopStringMatcher(["</answer>"])
    assert m.feed("The answer is 4</ans") == ("The answer is 4", None)
    assert m.feed("wer!") == ("</answer!", None)
    assert m.feed("done</answer> trailing") == ("done", "</answer>")
    assert m.feed("more") == ("", "</answer>")
    assert m.flush() == ""


def test_include_stop_str_and_no_stops():
    m = StopStringMatcher(["STOP"], include_stop_str=True)
    assert m.feed("abcST") == ("abc", None)
    assert m.feed("OPxyz") == ("STOP", "STOP")
    plain = StopStringMatcher([])
    assert plain.feed("anything") == ("anything", None)
    assert StopStringMatcher(["", "x"]).feed("ax") == ("a", "x")


def test_long_stop_strings_cost_linear_time():
    # Was 17.7 s and 1.9 GB for one 6,000-character stop (a regex over all its prefixes).
    import time

    started = time.perf_counter()
    stop = "ab" * 3000
    m = StopStringMatcher([stop, "x" * 1024, *("y" * n for n in range(1, 60))])
    text = "ab" * 2999 + "a"
    assert m.feed(text) == ("", None)  # all of it may still become the stop
    assert m.feed("b") == ("", stop)
    many = StopStringMatcher(["q" * 1000 + str(i) for i in range(64)])
    emitted, stopped = many.feed("q" * 100_000)
    assert stopped is None and len(emitted) == 100_000 - 1000  # the rest may be a stop
    assert many.feed("7") == ("", "q" * 1000 + "7")
    assert time.perf_counter() - started < 2.0
