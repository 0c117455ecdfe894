"""The start-up kernel warm-up (kernel_warmup.py): which steps it plans, that they are valid
steps of a real model, and that it stays off on the CPU."""

from __future__ import annotations

import pytest
import torch

from stator.engines.native import kernel_warmup as kw
from stator.engines.native.kernels import fused_moe as fm
from stator.engines.native.kernels import moe_dequant
from tests.engines.native.models import core_for, greedy_request, run_all, tokens_of


def test_token_counts_cover_both_sides_of_every_boundary():
    counts = kw.token_counts(8192, [2559, 100])
    assert counts[0] == 1 and counts[-1] == 8192
    for b in (2, 16, 1024, 4096, 2559, 100):
        assert b in counts and b + 1 in counts
    assert all(1 <= t <= 8192 for t in counts)
    assert kw.token_counts(20, [50]) == [1, 2, 3, 4, 5, 8, 9, 16, 17, 20]


def test_plan_stays_within_the_limits_and_meets_every_decode_split_and_table_width():
    block = 16
    steps = kw.plan(8192, 256, 8192, block, fm.token_boundaries(4))
    for s in steps:
        assert 1 <= s.tokens <= 8192 and s.decodes + 1 <= 256
        assert s.prefill <= 8192 and s.decode_len <= 8192
    assert sorted({s.decodes for s in steps}) == [0, 1, 2, 4, 8, 16, 32, 64, 128]
    widths = {-(-max(s.decode_len, *s.prompts) // block) for s in steps if s.decodes}
    assert 1 in widths and any(w % 16 == 0 for w in widths) and any(w % 16 > 1 for w in widths)
    assert any(not s.logits for s in steps)
    small = kw.plan(64, 4, 40, block)
    assert all(s.tokens <= 64 and s.decodes < 4 for s in small)
    assert all(max(s.decode_len, *s.prompts) <= 40 for s in small)
    assert [s.prompts for s in small if s.prefill == 64] == [[40, 24]]


def _choice(pairs: int) -> tuple:
    """What the MoE runs for `pairs` pairs of a bf16 model with packed experts."""
    if moe_dequant.MIN_PAIRS and pairs >= moe_dequant.MIN_PAIRS:
        return ("expanded", fm._config(pairs, 2880, 2880, "bytes"))
    if fm.uses_gemv(pairs):
        return ("gemv",)
    mode = fm.mxfp4_mode(pairs, torch.bfloat16)
    return (mode, fm._config(pairs, 2880, 2880, mode))


@pytest.mark.parametrize("top_k", [3, 4])
def test_moe_kernels_change_only_at_the_token_boundaries(top_k):
    """Between two boundaries the MoE runs one kernel path and tile, so warming each
    boundary and one past it meets them all."""
    bounds = fm.token_boundaries(top_k)
    for t in range(1, 4 * bounds[-1]):
        nxt = next((b for b in bounds if b >= t), None)
        reference = nxt if nxt is not None else 4 * bounds[-1]
        assert _choice(t * top_k) == _choice(reference * top_k), t


@pytest.mark.parametrize("name", ["gpt_oss", "llama3"])
def test_warm_up_steps_run_on_a_real_model_and_leave_the_cache_zeroed(checkpoints, name):
    model_dir, _ = checkpoints(name)
    request = greedy_request("a", list(range(3, 40)), 6)
    expected = tokens_of(run_all(core_for(model_dir), [request])["a"])
    core = core_for(model_dir, max_num_batched_tokens=300, max_num_seqs=9, max_model_len=128)
    runner = core.runner
    assert runner.model.kernel_warmup  # on CUDA it runs
    assert not kw.enabled(runner)  # CPU: start-up unchanged
    steps = kw.plan(300, 9, runner.max_model_len, runner.block_size, [7, 40])
    assert len(steps) > 20
    kw.run_steps(runner, steps)
    assert runner.kv_pool is not None and not runner.kv_pool.any()
    assert tokens_of(run_all(core, [request])["a"]) == expected


def test_compiles_after_the_warm_up_are_recorded_and_logged(monkeypatch, caplog):
    from triton.runtime.jit import JitFunctionInfo

    monkeypatch.setattr(kw, "compiled", [])
    fn = JitFunctionInfo(None, "_extend_kernel", None)
    kw._on_compile(repr="r", fn=fn, compile={"key": ("i32", "D")}, is_manual_warmup=False)
    assert kw.compiled == ["_extend_kernel ('i32', 'D')"] and not caplog.records
    monkeypatch.setattr(kw, "_serving", True)
    kw._on_compile(repr="r", fn=fn, compile={"key": ("i32", "")}, is_manual_warmup=False)
    assert "serving path" in caplog.text and "_extend_kernel ('i32', '')" in caplog.text
