import random
from collections import Counter

import pytest

from stator.router.cost import Candidate, choose
from stator.router.load import LoadTracker
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


def test_least_loaded_compares_fractional_loads():
    policy = make_policy("least-loaded", random.Random(0))
    loads = {(1, 0): 2.5, (2, 0): 2.25, (3, 0): 2.75}
    assert policy.select(KEYS, loads.get) == (2, 0)


def test_least_loaded_weighs_prefill_tokens_not_requests():
    # Worker 1 prefills one long prompt; worker 2 runs three short requests. By requests in
    # flight worker 1 is the less loaded; by the kv cost's measure it is far busier.
    block, weight = 16, 1.0
    tracker = LoadTracker()
    tracker.add("long", (1, 0), prefill_tokens=64 * block, blocks=64)
    for i in range(3):
        tracker.add(f"short{i}", (2, 0), prefill_tokens=block, blocks=1)
    keys = [(1, 0), (2, 0)]
    policy = make_policy("least-loaded", random.Random(0))
    assert policy.select(keys, lambda k: tracker.load(k).load_blocks(weight, block)) == (2, 0)
    # Once the long prompt is prefilled only its decode blocks remain: still heavier.
    tracker.prefill_done("long")
    assert tracker.load((1, 0)).load_blocks(weight, block) == 64
    assert tracker.load((2, 0)).load_blocks(weight, block) == 6
    # A weight of 0 compares decode blocks alone.
    tracker.finish("long")
    assert policy.select(keys, lambda k: tracker.load(k).load_blocks(0.0, block)) == (1, 0)


def test_least_loaded_agrees_with_kv_when_nothing_is_cached():
    """With no prefix cached anywhere, the kv cost is least-loaded's load plus the same
    prompt terms on every worker: both must pick the same worker whenever it is unique."""
    rng = random.Random(7)
    block, weight = 16, 1.5
    keys = [(w, 0) for w in range(6)]
    agreed = 0
    for trial in range(200):
        tracker = LoadTracker()
        for i in range(rng.randrange(8, 30)):
            rid = f"{trial}.{i}"
            tokens = rng.randrange(1, 40 * block)
            tracker.add(rid, rng.choice(keys), tokens, -(-tokens // block))
            if rng.random() < 0.5:
                tracker.prefill_done(rid)
        loads = {k: tracker.load(k).load_blocks(weight, block) for k in keys}
        if sorted(loads.values())[0] == sorted(loads.values())[1]:
            continue  # a tie: each policy breaks it its own way
        candidates = [
            Candidate(k, 0, 0, tracker.load(k).prefill_tokens, tracker.load(k).active_blocks)
            for k in keys
        ]
        prompt = rng.randrange(1, 20 * block)
        kv = choose(candidates, prompt, block, weight, 0.0, rng).key
        policy = make_policy("least-loaded", random.Random(0))
        assert policy.select(keys, loads.get) == kv
        agreed += 1
    assert agreed > 100  # most draws have a unique least-loaded worker


def test_power_of_two_never_picks_the_most_loaded():
    policy = make_policy("power-of-two", random.Random(0))
    loads = {(1, 0): 9, (2, 0): 1, (3, 0): 2}
    picks = Counter(policy.select(KEYS, loads.get) for _ in range(200))
    assert picks[(1, 0)] == 0 and picks[(2, 0)] > picks[(3, 0)] > 0
    assert policy.select(KEYS[:1], loads.get) == (1, 0)


def test_unknown_policy():
    with pytest.raises(ValueError):
        make_policy("kv")
