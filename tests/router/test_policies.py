import random
from collections import Counter

import pytest

from stator.router.policies import make_policy

KEYS = [(1, 0), (2, 0), (3, 0)]


def test_round_robin_cycles():
    policy = make_policy("round-robin")
    assert [policy.select(KEYS, lambda k: 0) for _ in range(4)] == KEYS + KEYS[:1]


def test_random_covers_everyone():
    policy = make_policy("random", random.Random(0))
    assert set(policy.select(KEYS, lambda k: 0) for _ in range(100)) == set(KEYS)


def test_least_loaded_picks_the_minimum_and_breaks_ties_at_random():
    policy = make_policy("least-loaded", random.Random(0))
    loads = {(1, 0): 3, (2, 0): 1, (3, 0): 2}
    assert policy.select(KEYS, loads.get) == (2, 0)
    picks = Counter(policy.select(KEYS, lambda k: 0) for _ in range(100))
    assert len(picks) == 3


def test_power_of_two_never_picks_the_most_loaded():
    policy = make_policy("power-of-two", random.Random(0))
    loads = {(1, 0): 9, (2, 0): 1, (3, 0): 2}
    picks = Counter(policy.select(KEYS, loads.get) for _ in range(200))
    assert picks[(1, 0)] == 0 and picks[(2, 0)] > picks[(3, 0)] > 0
    assert policy.select(KEYS[:1], loads.get) == (1, 0)


def test_unknown_policy():
    with pytest.raises(ValueError):
        make_policy("kv")
