"""The workload floor (`benchmarks/serving_workloads.floor`) on hand-computed cases, and
against the cost of explicit schedules on the same model: never above any, equal to one."""

from __future__ import annotations

import itertools
import math
import random

import pytest

from benchmarks.serving_workloads import PROFILES, floor
from tests.benchmarks.tiny_shape import TINY, UNIT


def test_one_request_takes_as_many_steps_as_its_output():
    f = floor([(3, 4)], TINY, UNIT, max_seqs=2)
    assert (f["steps_by_tokens"], f["longest_output"], f["steps"]) == (2, 4, 4)
    # Prefill: 2 x 22 x 3 (layers) + 2 x 6 (the head, last token) + 8 x (1 + 2 + 3).
    assert f["prefill_s"] == 132 + 12 + 48
    # Decode: 4 weight passes of 56 bytes; tokens 1-3 read 3, 4, 5 earlier positions.
    assert f["decode_s"] == 4 * 56 + 8 * (3 + 4 + 5)
    assert f["seconds"] == 512 and f["output_tok_s"] == 4 / 512
    # The old floor: 2 steps, KV for 4 tokens from the first, the head on every prompt token,
    # attention as isl squared.
    old = f["old"]
    assert old["steps"] == 2
    assert old["seconds"] == (2 * 28 * 3 + 2 * 9 * 2) + (2 * 56 + 8 * (4 * 3 + 6))


def test_many_short_requests_are_bound_by_the_batch_cap():
    f = floor([(1, 2)] * 5, TINY, UNIT, max_seqs=2)
    assert (f["steps_by_tokens"], f["longest_output"], f["steps"]) == (5, 2, 5)
    assert f["steps"] == f["old"]["steps"]


def test_a_one_token_output_decodes_nothing():
    f = floor([(4, 1)], TINY, UNIT, max_seqs=8)
    assert f["steps"] == 1 and f["decode_s"] == 56


def _additive_cost(schedule: list[list[tuple[int, int]]], lengths, max_seqs: int) -> float:
    """The floor's model, step by step: a step streams the weights once; the step sampling
    request r's token k computes its whole prompt when k = 0 (unit rates) and reads its
    `isl + k - 1` earlier positions' KV when k >= 1."""
    cost = 0.0
    done = [0] * len(lengths)
    for step in schedule:
        assert 0 < len(step) <= max_seqs and len({r for r, _ in step}) == len(step)
        cost += 56
        for r, k in step:
            isl, osl = lengths[r]
            assert k == done[r] < osl  # tokens in order, one per step
            done[r] += 1
            if k == 0:
                cost += 2 * 22 * isl + 2 * 6 + 8 * isl * (isl + 1) / 2
            else:
                cost += 8 * (isl + k - 1)
    assert done == [o for _, o in lengths]
    return cost


def _wrap_around(lengths, max_seqs: int, steps: int) -> list[list[tuple[int, int]]]:
    """McNaughton: request after request, `steps` slots a lane, wrapping to the next lane."""
    schedule: list[list[tuple[int, int]]] = [[] for _ in range(steps)]
    slot = 0
    for r, (_, osl) in enumerate(lengths):
        for k in range(osl):
            schedule[slot % steps].append((r, k))
            slot += 1
    assert slot <= steps * max_seqs
    for step in schedule:  # the wrapped request's late tokens sit in early steps: sort
        step.sort()
    return _in_order(schedule)


def _in_order(schedule):
    """Reorder each request's tokens to follow the steps they were placed in."""
    seen: dict[int, int] = {}
    out = []
    for step in schedule:
        row = []
        for r, _ in step:
            row.append((r, seen.get(r, 0)))
            seen[r] = seen.get(r, 0) + 1
        out.append(row)
    return [row for row in out if row]


def _greedy(lengths, max_seqs: int, rng: random.Random) -> list[list[tuple[int, int]]]:
    """A random admission order, at most `max_seqs` running: one of many valid schedules."""
    order = list(range(len(lengths)))
    rng.shuffle(order)
    waiting, running, schedule = order, {}, []
    while waiting or running:
        while waiting and len(running) < max_seqs and rng.random() < 0.8:
            running[waiting.pop(0)] = 0
        if not running:
            running[waiting.pop(0)] = 0
        step = [(r, k) for r, k in running.items()]
        schedule.append(step)
        for r, k in step:
            running[r] = k + 1
            if running[r] == lengths[r][1]:
                del running[r]
    return schedule


@pytest.mark.parametrize("seed", range(20))
def test_no_schedule_beats_the_floor_and_the_wrap_around_meets_it(seed):
    rng = random.Random(seed)
    lengths = [(rng.randint(1, 9), rng.randint(1, 12)) for _ in range(rng.randint(1, 9))]
    max_seqs = rng.randint(1, 4)
    f = floor(lengths, TINY, UNIT, max_seqs)
    for _ in range(10):
        cost = _additive_cost(_greedy(lengths, max_seqs, rng), lengths, max_seqs)
        assert f["seconds"] <= cost + 1e-9
    tight = _wrap_around(lengths, max_seqs, f["steps"])
    assert len(tight) == f["steps"]
    assert math.isclose(_additive_cost(tight, lengths, max_seqs), f["seconds"])


def test_an_exhaustive_small_case():
    """Two requests (outputs 3 and 1), one sequence a step or two: every order of steps."""
    lengths = [(2, 3), (1, 1)]
    for max_seqs in (1, 2):
        f = floor(lengths, TINY, UNIT, max_seqs)
        best = math.inf
        tokens = [(0, 0), (0, 1), (0, 2), (1, 0)]
        for n in range(2, 5):
            for cut in itertools.product(range(n), repeat=len(tokens)):
                steps = [[t for t, c in zip(tokens, cut, strict=True) if c == i] for i in range(n)]
                if any(not s or len(s) > max_seqs for s in steps):
                    continue
                order = {t: c for t, c in zip(tokens, cut, strict=True)}
                if not order[(0, 0)] < order[(0, 1)] < order[(0, 2)]:
                    continue
                best = min(best, _additive_cost(steps, lengths, max_seqs))
        assert math.isclose(f["seconds"], best)


def test_sharegpt_is_bound_by_its_longest_outputs_and_heavy_by_the_count():
    cfg = {  # benchmarks/native_gpu_serve.py's 8B shape, the bundled vocabulary
        "hidden_size": 4096,
        "intermediate_size": 14336,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "vocab_size": 4096,
    }
    rates = {"matmul_flops": 8e14, "copy_bytes_s": 3e12}
    share = floor(PROFILES["sharegpt"](1000), cfg, rates, 256)
    assert (share["steps_by_tokens"], share["longest_output"]) == (856, 1500)
    assert share["output_tok_s"] < 0.85 * share["old"]["output_tok_s"]
    heavy = floor(PROFILES["heavy"](1000), cfg, rates, 256)
    assert heavy["steps"] == heavy["old"]["steps"] == 1365
    # Counting KV reads and the head exactly lowers the floor's time a little, never raises it.
    assert heavy["seconds"] <= heavy["old"]["seconds"]
    for f in (share, heavy):
        assert f["roofline"]["seconds"] <= f["seconds"]
