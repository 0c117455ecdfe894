"""The decode-tile sweep's pick (`benchmarks/decode_tiles.pick`): the fastest tile on the
Llama cases, unless it is no real gain or it slows GPT-OSS's shape down."""

from __future__ import annotations

from benchmarks.decode_tiles import pick

DEFAULT = ("auto", 1)


def test_the_fastest_tile_wins_when_gpt_oss_keeps_its_speed():
    totals = {DEFAULT: 100.0, ("64,4,3,1", 1): 80.0, ("32,4,3,1", 2): 90.0}
    gpt = {DEFAULT: 50.0, ("64,4,3,1", 1): 51.0}  # 2% slower: within the slack
    assert pick(totals, gpt, DEFAULT) == ("64,4,3,1", 1)


def test_a_tile_that_slows_gpt_oss_gives_way_to_the_next():
    totals = {DEFAULT: 100.0, ("64,4,3,1", 1): 80.0, ("32,4,3,1", 2): 90.0}
    gpt = {DEFAULT: 50.0, ("64,4,3,1", 1): 60.0, ("32,4,3,1", 2): 49.0}
    assert pick(totals, gpt, DEFAULT) == ("32,4,3,1", 2)


def test_the_default_stays_when_nothing_is_clearly_faster():
    assert pick({DEFAULT: 100.0, ("64,4,3,1", 1): 99.5}, {}, DEFAULT) == DEFAULT
    assert pick({DEFAULT: 100.0, ("64,4,3,1", 1): 120.0}, {}, DEFAULT) == DEFAULT
    slower_gpt = {DEFAULT: 50.0, ("64,4,3,1", 1): 60.0}
    assert pick({DEFAULT: 100.0, ("64,4,3,1", 1): 80.0}, slower_gpt, DEFAULT) == DEFAULT


def test_without_the_default_timed_the_fastest_measured_wins():
    assert pick({("64,4,3,1", 1): 80.0, ("32,4,3,1", 2): 90.0}, {}, DEFAULT) == ("64,4,3,1", 1)
    assert pick({}, {}, DEFAULT) == DEFAULT


def test_a_tile_whose_gpt_oss_time_was_not_taken_is_not_picked():
    totals = {DEFAULT: 100.0, ("64,8,3,1", 1): 80.0, ("32,4,3,1", 2): 90.0}
    gpt = {DEFAULT: 50.0, ("32,4,3,1", 2): 50.0}
    assert pick(totals, gpt, DEFAULT) == ("32,4,3,1", 2)
    assert pick(totals, {}, DEFAULT) == ("64,8,3,1", 1)  # none timed: the Llama time alone
