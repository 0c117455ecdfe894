import random
from collections import Counter

import pytest

from stator.kv.hashing import block_hashes
from stator.router import RouterConfig
from stator.router.cost import Candidate, choose, cost
from stator.router.kv_index import KvIndex

BS = 4
LETTERS = {c: i + 1 for i, c in enumerate("ABCDEFG")}


def prompt(word: str) -> list[int]:
    return [LETTERS[c] for c in word for _ in range(BS)]


def hashes(word: str) -> list[int]:
    return block_hashes(prompt(word), BS)


def candidates(index: KvIndex, word: str, keys) -> list[Candidate]:
    matches = index.find_matches(hashes(word))
    return [Candidate(k, matches.get(k, 0), index.tree_size(k), 0, 0) for k in keys]


def test_dynamo_tie_break_scenario():
    """dynamo tests/router/common.py::_test_router_decisions, on an idle fleet."""
    a, b = (1, 0), (2, 0)
    index = KvIndex(BS)
    index.store(a, hashes("AB"))
    index.store(a, hashes("ACD"))
    index.store(b, hashes("ACE"))
    assert (index.tree_size(a), index.tree_size(b)) == (4, 3)
    rng = random.Random(0)
    # A longer match wins.
    choice = choose(candidates(index, "ACDF", [a, b]), 4 * BS, BS, 1.0, 0.0, rng)
    assert choice.key == a and choice.overlap_blocks == 3
    # Equal match (A, C): the worker with the smaller cache wins, every time.
    for _ in range(20):
        choice = choose(candidates(index, "ACG", [a, b]), 3 * BS, BS, 1.0, 0.0, rng)
        assert choice.key == b and choice.overlap_blocks == 2


def test_cost_formula_matches_dynamos_worked_example():
    # (prefill 8, decode 10) -> 18, (5, 5) -> 10, (2, 9) -> 11: worker 2 wins.
    cands = [
        Candidate((1, 0), 0, 0, 8 * BS, 10),
        Candidate((2, 0), 0, 0, 5 * BS, 5),
        Candidate((3, 0), 0, 0, 2 * BS, 9),
    ]
    assert [cost(c, 0, BS, 1.0) for c in cands] == [18, 10, 11]
    assert choose(cands, 0, BS, 1.0, 0.0, random.Random(0)).key == (2, 0)


def test_uncached_prompt_counts_as_prefill_and_unheld_blocks_as_decode():
    c = Candidate(
        (1, 0), overlap_blocks=2, cached_blocks=0, inflight_prefill_tokens=0, active_blocks=3
    )
    # 10 tokens = 3 blocks, 2 cached: 2 tokens (0.5 block) to prefill; no active request
    # holds any of the 3 blocks, so all 3 become active.
    assert cost(c, 10, BS, 2.0) == pytest.approx(2.0 * 0.5 + 3 + 3)
    # A running request already holds the first 2: only 1 more becomes active.
    shared = c._replace(active_overlap=2)
    assert cost(shared, 10, BS, 2.0) == pytest.approx(2.0 * 0.5 + 3 + 1)
    # A weight of 0 leaves the decode side only.
    assert cost(shared, 10, BS, 0.0) == 3 + 1
    # choose() computes the same costs.
    other = Candidate((2, 0), 0, 0, 4, 0)
    choice = choose([shared, other], 10, BS, 2.0, 0.0, random.Random(0))
    assert choice.costs == {c.key: cost(shared, 10, BS, 2.0), other.key: cost(other, 10, BS, 2.0)}


def test_load_outweighs_affinity():
    cached_but_busy = Candidate((1, 0), 8, 100, 0, 50)
    idle = Candidate((2, 0), 0, 0, 0, 0)
    choice = choose([cached_but_busy, idle], 8 * BS, BS, 1.0, 0.0, random.Random(0))
    assert choice.key == (2, 0)


def test_default_weight_keeps_a_returning_conversation_on_its_cached_worker():
    """The Mooncake case (block size 64): a 160-block prompt whose first 150 blocks are
    cached on a worker that runs one other 160-block request, against an idle worker
    with nothing cached. At Dynamo's w = 1 the other request's active blocks (160) outweigh
    the 150 cached blocks and the prompt goes to the idle worker to be prefilled again; at
    the default w the cached worker wins. Queued prefill still moves it (load counts)."""
    size, prompt_tokens = 64, 160 * 64
    weight = RouterConfig().kv_overlap_score_weight
    cached = Candidate((1, 0), 150, 150, 0, 160)
    idle = Candidate((2, 0), 0, 0, 0, 0)
    rng = random.Random(0)
    assert choose([cached, idle], prompt_tokens, size, 1.0, 0.0, rng).key == idle.key
    assert choose([cached, idle], prompt_tokens, size, weight, 0.0, rng).key == cached.key
    queued = cached._replace(inflight_prefill_tokens=200 * size)
    assert choose([queued, idle], prompt_tokens, size, weight, 0.0, rng).key == idle.key


def test_full_ties_are_broken_at_random():
    cands = [Candidate((i, 0), 0, 0, 0, 0) for i in range(3)]
    rng = random.Random(1)
    picks = Counter(choose(cands, 16, BS, 1.0, 0.0, rng).key for _ in range(300))
    assert set(picks) == {(0, 0), (1, 0), (2, 0)}


def test_temperature_samples_mostly_the_cheapest():
    cands = [Candidate((1, 0), 0, 0, 0, 0), Candidate((2, 0), 0, 0, 0, 10)]
    rng = random.Random(2)
    picks = Counter(choose(cands, 16, BS, 1.0, 0.5, rng).key for _ in range(1000))
    # p(worse) = e^-2 / (1 + e^-2) ~ 0.12
    assert 40 < picks[(2, 0)] < 250
    assert picks[(1, 0)] > picks[(2, 0)]
    # Temperature with equal costs is uniform.
    same = [Candidate((1, 0), 0, 0, 0, 1), Candidate((2, 0), 0, 0, 0, 1)]
    picks = Counter(choose(same, 16, BS, 1.0, 1.0, rng).key for _ in range(400))
    assert min(picks.values()) > 120


def test_no_candidates():
    with pytest.raises(ValueError):
        choose([], 16, BS, 1.0, 0.0, random.Random(0))
