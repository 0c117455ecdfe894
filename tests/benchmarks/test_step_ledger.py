"""The per-step ledger (`benchmarks/step_ledger.py`) and the step shapes it prices
(`step_profile.step_work`) on explicit steps: hand-computed floors, the classes' sums, and
the step floors of a schedule that takes the floor's steps adding up to the workload floor."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from serving_workloads import floor
from step_ledger import format_ledger, ledger, step_class, step_floor
from step_profile import step_work

from tests.benchmarks.tiny_shape import TINY, UNIT

SHAPE = {"params": 28, "head": 6, "weight_bytes": 56, "kv_bytes_per_token": 8}
SHAPE["attn_flops_per_pair"] = 8


def rec(mode: str, device: float, computed, prompt, news, gap: float = 0.0) -> dict:
    return {"mode": mode, "device": device, "wall": device, "gap": gap} | step_work(
        computed, prompt, news
    )


def test_step_work_splits_decodes_from_prompt_chunks():
    # A decode at 7 computed, a chunk 0-3 of a 5-token prompt, its rest (3-4: ends it),
    # and a preempted sequence recomputing 4 tokens past its 2-token prompt.
    w = step_work([7, 0, 3, 0], [5, 5, 5, 2], [1, 3, 2, 4])
    assert w == {
        "decodes": 1,
        "kv_context": 7,
        "prefill_tokens": 9,
        "prompts_ended": 2,
        # 0-2: 1 + 2 + 3; 3-4: 4 + 5; 0-3: 1 + 2 + 3 + 4.
        "attn_pairs": 6 + 9 + 10,
    }
    # A one-token prompt chunk is not a decode.
    assert step_work([2], [3], [1])["decodes"] == 0


def test_a_steps_floor_adds_its_compute_and_memory_and_the_roofline_takes_the_larger():
    r = rec("pieces", 0.0, [4, 0], [2, 3], [1, 3])  # a decode at 4 + a 3-token prompt
    f = step_floor(r, SHAPE, UNIT)
    # Prompt: 2 x 22 x 3 + 2 x 6 (one head row) + 8 x 6 pairs; memory: 56 + 8 x 4.
    assert f["compute_s"] == 132 + 12 + 48
    assert f["memory_s"] == 56 + 32
    assert f["additive"] == 192 + 88
    # Roofline: all FLOPs (+ the decode's 2 x 28 and 8 x (4 + 1)) against the bytes.
    assert f["roofline"] == 192 + 56 + 40
    slow = step_floor(r, SHAPE, {"matmul_flops": 1e6, "copy_bytes_s": 1.0})
    assert slow["roofline"] == slow["memory_s"] == 88


def test_classes_follow_batch_bands_and_how_a_mixed_step_ran():
    def cls(mode, decodes, prefill=0):
        return step_class(
            {"mode": mode, "decodes": decodes, "prefill_tokens": prefill, "kv_context": 0}
        )

    assert cls("graph", 1) == "decode 1-8"
    assert cls("graph", 9) == "decode 9-32"
    assert cls("graph", 255) == "decode 129-255"
    assert cls("graph", 256) == "decode 256+"
    assert cls("eager", 40) == "decode 33-128 eager"
    assert cls("pieces", 40, 600) == "mixed pieces"
    assert cls("eager", 200, 3000) == "mixed eager"
    assert cls("eager", 0, 3000) == "mixed eager"
    assert cls("none", 0) is None


def test_the_ledger_sums_excess_by_class_and_gaps_apart():
    steps = [
        rec("eager", 400.0, [0, 0], [3, 2], [3, 2]),  # two whole prompts
        rec("graph", 100.0, [3, 2], [3, 2], [1, 1], gap=5.0),
        rec("graph", 90.0, [3], [2], [1], gap=2.0),
        {**rec("none", 0.0, [], [], []), "wall": 1.0},  # the last read-back
    ]
    led = ledger(steps, TINY, UNIT)
    prompts = 2 * 22 * 5 + 2 * 6 * 2 + 8 * (6 + 3)  # 220 + 24 + 72
    assert [r["floor"] for r in led["rows"]] == [prompts + 56, 56 + 8 * 5, 56 + 8 * 3, 56]
    eager = led["classes"]["mixed eager"]
    assert eager["steps"] == 1 and eager["excess"] == 400 - (prompts + 56)
    decode = led["classes"]["decode 1-8"]
    assert decode["steps"] == 2
    assert decode["floor"] == 96 + 80 and decode["excess"] == 190 - 176
    assert decode["excess_ms_per_step"] == 1e3 * 14 / 2
    assert decode["mean_decodes"] == 1.5 and decode["mean_kv_context"] == 4
    t = led["totals"]
    assert t["steps"] == 3 and t["gaps_s"] == 7.0 and t["device_s"] == 590.0
    assert t["wall_s"] == 591.0
    assert t["excess_s"] == pytest.approx(eager["excess"] + decode["excess"])
    assert t["stalls"] == 0 and t["stall_excess_s"] == 0
    # The largest excess first.
    assert list(led["classes"]) == ["mixed eager", "decode 1-8"]
    assert "| mixed eager | 1 |" in format_ledger(led)


def test_step_floors_of_a_schedule_with_the_floors_steps_add_up_to_the_workload_floor():
    # Requests (3 in, 2 out) and (2 in, 3 out), two a step: the floor's 3 steps.
    lengths = [(3, 2), (2, 3)]
    work = floor(lengths, TINY, UNIT, max_seqs=2)
    assert work["steps"] == 3
    schedule = [
        rec("eager", 0.0, [0, 0], [3, 2], [3, 2]),  # both prompts: first tokens
        rec("graph", 0.0, [3, 2], [3, 2], [1, 1]),  # second tokens (read 3 and 2)
        rec("graph", 0.0, [3], [2], [1]),  # the second request's third token (reads 3)
    ]
    led = ledger(schedule, TINY, UNIT, work)
    assert led["totals"]["step_floors_s"] == pytest.approx(work["seconds"])
    assert led["totals"]["extra_steps_s"] == pytest.approx(0.0)
    # One step more (the first tokens in two steps) costs one weight pass.
    split = [
        rec("eager", 0.0, [0], [3], [3]),
        rec("eager", 0.0, [3, 0], [3, 2], [1, 2]),
        rec("graph", 0.0, [2], [2], [1]),
        rec("graph", 0.0, [3], [2], [1]),
    ]
    led = ledger(split, TINY, UNIT, work)
    assert led["totals"]["extra_steps_s"] == pytest.approx(56)


def test_a_step_far_over_its_floor_is_counted_as_a_stall_too():
    unit = {"matmul_flops": 1e3, "copy_bytes_s": 1e3}  # this decode step's floor: 0.08 s
    steps = [
        rec("graph", 0.07, [3], [2], [1]),
        rec("graph", 0.30, [3], [2], [1]),  # over 3 x 0.08 + 0.05 s
    ]
    led = ledger(steps, TINY, unit)
    floor_s = led["rows"][0]["floor"]
    assert floor_s == pytest.approx((56 + 8 * 3) / 1e3)
    t = led["totals"]
    assert t["stalls"] == 1 and t["stall_excess_s"] == pytest.approx(0.30 - floor_s)
    assert led["classes"]["decode 1-8"]["steps"] == 2  # still in its class
    assert t["cuda_mallocs"] == t["alloc_retries"] == 0


def test_the_allocators_work_after_slow_steps_is_summed():
    steps = [
        rec("graph", 0.3, [3], [2], [1]) | {"cuda_mallocs": 2, "alloc_retries": 1},
        rec("graph", 0.1, [3], [2], [1]),
        rec("eager", 0.4, [0], [5], [5]) | {"cuda_mallocs": 3, "alloc_retries": 0},
    ]
    t = ledger(steps, TINY, UNIT)["totals"]
    assert (t["cuda_mallocs"], t["alloc_retries"]) == (5, 1)
    assert "5 cudaMalloc, 1 allocator retries" in format_ledger(ledger(steps, TINY, UNIT))
