"""Piecewise CUDA graphs for mixed steps (`piecewise.py`): the buckets, and the split forward
pass (pieces + attention between them) against the model's own forward pass. On the CPU the
pieces run eagerly (`replay=False`): the same split, the same padding; the GPU tests replay
the captured graphs (`-m gpu`)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from stator.engines.native import piecewise, step_graphs
from stator.engines.native.context import set_context
from stator.engines.native.model_runner import ModelRunner, StepInputs
from stator.engines.native.piecewise import PiecewiseGraphs, pick_bucket, token_buckets
from tests.engines.native.models import core_for, greedy_request, prompt, run_all, tokens_of


def test_token_buckets_are_ascending_end_at_the_limit_and_pad_at_most_one_spacing():
    buckets = token_buckets(2048)
    assert buckets == sorted(set(buckets)) and buckets[-1] == 2048
    assert buckets[:3] == [16, 32, 48] and 256 in buckets and 288 in buckets
    gaps = [b - a for a, b in zip([0, *buckets], buckets, strict=False)]
    assert max(g for g, b in zip(gaps, buckets, strict=True) if b <= 1024) == 16
    assert max(gaps) == 64 and len(buckets) == 64 + 16
    assert token_buckets(100) == [16, 32, 48, 64, 80, 96, 100]
    assert token_buckets(10) == [10]
    assert token_buckets(8192)[-1] == 8192 and token_buckets(0) == []


def test_pick_bucket_takes_the_smallest_that_holds_the_step():
    buckets = token_buckets(300)
    assert pick_bucket(buckets, 1) == 16
    assert pick_bucket(buckets, 16) == 16
    assert pick_bucket(buckets, 17) == 32
    assert pick_bucket(buckets, 257) == 272
    assert pick_bucket(buckets, 300) == 300
    assert pick_bucket(buckets, 301) is None


def _seq(tokens: list[int], computed: int, blocks: list[int]) -> SimpleNamespace:
    """What `ModelRunner.prepare` reads of a sequence."""
    return SimpleNamespace(
        token_ids=tokens,
        num_computed_tokens=computed,
        num_prompt_tokens=len(tokens),
        block_ids=blocks,
        prompt_embeds=None,
    )


def _steps(runner: ModelRunner) -> tuple[StepInputs, StepInputs]:
    """Two prompts prefilled (30 tokens); then one step of: their two decodes, a new
    13-token prompt and the first 9-token chunk of another (decodes first, as the scheduler
    orders them; 24 tokens)."""
    a, b = prompt(1, 21), prompt(2, 9)
    first = runner.prepare([_seq(a, 0, [1, 2]), _seq(b, 0, [3])], [21, 9], [20, 29])
    seqs = [
        _seq([*a, 7], 21, [1, 2]),
        _seq([*b, 8], 9, [3]),
        _seq(prompt(3, 13), 0, [4]),
        _seq(prompt(4, 40), 0, [5, 6, 7]),
    ]
    return first, runner.prepare(seqs, [1, 1, 13, 9], [0, 1, 14, 23])


def _mixed_step(runner: ModelRunner) -> StepInputs:
    first, mixed = _steps(runner)
    runner.execute(first)
    return mixed


def _pieces_logits(runner: ModelRunner, pieces: PiecewiseGraphs, inputs: StepInputs, replay: bool):
    ctx = inputs.ctx
    runner.backend.plan(ctx, runner.sliding_window)
    set_context(ctx)
    try:
        hidden = pieces.run(inputs.input_ids, ctx, replay=replay)
    finally:
        set_context(None)
    return runner.model.compute_logits(hidden[inputs.logits_rows]).float()


@pytest.mark.parametrize("name", ["llama3", "qwen2", "qwen3", "mistral_window"])
def test_split_forward_pass_matches_the_model_on_a_mixed_step(checkpoints, name):
    model_dir, _ = checkpoints(name)
    runner = core_for(model_dir).runner
    assert piecewise.supports(runner.model) and runner.piecewise is None  # CPU: no graphs
    first, inputs = _steps(runner)
    assert not inputs.plain_decode and piecewise.eligible(inputs.ctx, runner.model)
    pieces = PiecewiseGraphs(runner.model, 64, runner.device)
    first_logits = runner.execute(first)
    torch.testing.assert_close(
        _pieces_logits(runner, pieces, first, replay=False), first_logits, rtol=1e-4, atol=1e-4
    )
    expected = runner.execute(inputs)
    # 24 tokens in a 32-token bucket: 8 padded rows, with the ids, positions and KV slots
    # of the first step's tokens 24..31 (stored there, they would overwrite the cache).
    got = _pieces_logits(runner, pieces, inputs, replay=False)
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)
    again = _pieces_logits(runner, pieces, inputs, replay=False)  # stale rows from step 1
    torch.testing.assert_close(again, expected, rtol=1e-4, atol=1e-4)


def test_gpt_oss_and_adapter_steps_are_not_piecewise(checkpoints):
    model_dir, _ = checkpoints("gpt_oss")
    runner = core_for(model_dir).runner
    assert not piecewise.supports(runner.model)
    llama_dir, _ = checkpoints("llama3")
    llama = core_for(llama_dir).runner
    inputs = _mixed_step(llama)
    inputs.ctx.lora = object()
    assert not piecewise.eligible(inputs.ctx, llama.model)
    inputs.ctx.lora = None
    llama.model.model.aux_layers = (1,)  # EAGLE-3 reads hidden states the pieces do not keep
    try:
        assert not piecewise.eligible(inputs.ctx, llama.model)
    finally:
        llama.model.model.aux_layers = ()


# -- on the device ---------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["llama3", "qwen3", "mistral_window"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_piecewise_graphs_match_eager_on_a_mixed_step(checkpoints, name, dtype):
    model_dir, _ = checkpoints(name)
    runner = core_for(model_dir, device="cuda", dtype=dtype, kv_cache_memory="64MiB").runner
    limit = min(runner.config.piecewise_max_tokens, runner.config.max_num_batched_tokens)
    assert runner.piecewise is not None and runner.piecewise.max_tokens == limit == 1024
    inputs = _mixed_step(runner)
    graphed = step_graphs.run(runner, inputs)
    assert graphed is not None
    pieces, runner.piecewise = runner.piecewise, None
    try:
        eager = runner.execute(inputs)
    finally:
        runner.piecewise = pieces
    # Padded to a bucket, matmuls may take other kernels: rounding-level differences.
    tol = (1e-4 if dtype == "float32" else 2e-2) * float(eager.abs().max())
    assert float((graphed - eager).abs().max()) <= tol
    assert torch.equal(graphed.argmax(-1), eager.argmax(-1))
    # The same split run eagerly on the same device: the graphs replay exactly it.
    split = _pieces_logits(runner, pieces, inputs, replay=False)
    assert float((graphed - split).abs().max()) <= tol / 10


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_engine_outputs_match_with_and_without_piecewise_graphs(llama):
    model_dir, _ = llama
    reqs = lambda: [  # noqa: E731
        greedy_request(f"r{i}", prompt(10 + i, 5 + 23 * i), 24) for i in range(6)
    ]
    outs = {}
    for mode in ("full_and_piecewise", "full_decode_only"):
        core = core_for(
            model_dir,
            device="cuda",
            dtype="float32",
            kv_cache_memory="64MiB",
            cudagraph_mode=mode,
            max_num_batched_tokens=96,  # chunked prompts mixed with decodes
        )
        assert (core.runner.piecewise is not None) == (mode == "full_and_piecewise")
        out = run_all(core, reqs())
        outs[mode] = {rid: tokens_of(o) for rid, o in out.items()}
    assert outs["full_and_piecewise"] == outs["full_decode_only"]
