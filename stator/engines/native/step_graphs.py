"""Which CUDA graphs a model runner captures, and which one (if any) runs a step.

- decode graphs (`cuda_graphs.py`): the whole forward pass of a plain decode step, per
  batch-size bucket, with LoRA variants;
- verify graphs: the same for speculative decoding's verification steps (no LoRA);
- piecewise graphs (`piecewise.py`): everything but attention, per token-count bucket, for
  every other step (mixed prefill + decode, prefill) that fits the largest bucket.

`--cudagraph-mode full_decode_only` keeps only the first two (mixed steps eager), as vLLM's
mode of that name; `--enforce-eager` captures nothing.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from stator.engines.native import piecewise
from stator.engines.native.attention import TorchAttention
from stator.engines.native.context import set_context
from stator.engines.native.cuda_graphs import DecodeGraphs
from stator.engines.native.spec.config import MAX_VERIFY_BATCH, verify_tokens

if TYPE_CHECKING:
    from stator.engines.native.model_runner import ModelRunner, StepInputs


def capture(runner: ModelRunner, *, prepare: bool) -> None:
    """Capture the runner's graphs (`prepare`: first time, set up what they need)."""
    # The torch backend's plan reads the step's lengths on the host: no graphs for it.
    graphable = not isinstance(runner.backend, TorchAttention)
    config = runner.config
    if runner.device.type != "cuda" or config.enforce_eager or not graphable:
        return
    max_batch = min(config.max_graph_batch or config.max_num_seqs, 512)
    if prepare:
        runner._prepare_graphs(max_batch)
    runner.graphs = _decode_graphs(runner, max_batch, 1)
    runner.graphs.capture()
    q = verify_tokens(config.speculative_config)
    if q and runner.lora_slots is None:
        runner.verify_graphs = _decode_graphs(runner, min(max_batch, MAX_VERIFY_BATCH), q)
        runner.verify_graphs.capture()
    max_tokens = min(config.piecewise_max_tokens, config.max_num_batched_tokens)
    if (
        config.cudagraph_mode == "full_and_piecewise"
        and max_tokens > 0
        and runner.spec.tp.size == 1
        and piecewise.supports(runner.model)
    ):
        runner.piecewise = piecewise.PiecewiseGraphs(runner.model, max_tokens, runner.device)
        runner.piecewise.capture()


def release(runner: ModelRunner) -> None:
    """Drop every graph (their memory pools go with them)."""
    runner.graphs = runner.verify_graphs = runner.piecewise = None


def _decode_graphs(runner: ModelRunner, max_batch: int, tokens_per_seq: int) -> DecodeGraphs:
    slots = runner.lora_slots
    return DecodeGraphs(
        runner.model,
        runner.backend,
        max_batch=max_batch,
        max_blocks_per_seq=-(-runner.max_model_len // runner.block_size),
        max_model_len=runner.max_model_len,
        block_size=runner.block_size,
        sliding_window=runner.sliding_window,
        device=runner.device,
        lora_slots=runner.config.max_loras if slots is not None else 0,
        lora_workspace=slots.workspace_shape() if slots is not None else None,
        tokens_per_seq=tokens_per_seq,
    )


def run(runner: ModelRunner, inputs: StepInputs) -> torch.Tensor | None:
    """The step's logits [rows, vocab] in float32 from a graph; None when no graph takes
    it (the runner then runs it eagerly)."""
    ctx = inputs.ctx
    batch, width = ctx.block_tables.shape
    graphs = runner.graphs
    if graphs is not None and inputs.plain_decode and graphs.fits(batch, width):
        return graphs.run(inputs.input_ids, ctx).float()
    verify = runner.verify_graphs
    if (
        verify is not None
        and inputs.rows_per_seq == verify.tokens_per_seq
        and ctx.lora is None
        and verify.fits(batch, width)
    ):
        return verify.run(inputs.input_ids, ctx).float()
    pieces = runner.piecewise
    if (
        pieces is None
        or inputs.input_ids.shape[0] > pieces.max_tokens
        or not piecewise.eligible(ctx, runner.model)
    ):
        return None
    runner.backend.plan(ctx, runner.sliding_window)
    set_context(ctx)
    try:
        hidden = pieces.run(inputs.input_ids, ctx)
    finally:
        set_context(None)
    return runner.model.compute_logits(hidden[inputs.logits_rows]).float()
