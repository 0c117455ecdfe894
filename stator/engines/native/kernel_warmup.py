"""Kernel warm-up at start-up (CUDA): eager steps of the shapes the scheduler can produce, run
once before the worker says it is ready, so no Triton kernel compiles on the serving path.

Why: Triton compiles a kernel the first time it meets a new combination of its constexpr
arguments and of its integer arguments' specialization (equal to 1, a multiple of 16, other).
Decode steps replay CUDA graphs captured at start-up for every batch-size bucket, so they
are compiled already; mixed and prefill steps run eagerly with token counts, decode counts
and block-table widths that vary from step to step. On GPT-OSS the first HTTP serve on a
fresh machine ran at 0.52x the second (2026-11-27): the MoE's tile buckets, the attention
kernels' variants and the LM head compiled while requests waited. vLLM does the same at
start-up: a profile run at the token budget, dummy runs over its compile sizes, then a
CUDA-graph capture for every decode batch size.

The steps (`plan`, pure): a prefill of T tokens for each T of `token_counts` (1, every
power of two up to the token budget and one past it, and the model's own boundaries, where
its kernels change tile or path: `warmup_token_counts`; several prompts where T exceeds the
model length), one prompt chunk without a logits row, and mixed steps of 1, 2, 4, ... decodes (each power of two: the split-K decode kernel's
split count depends on it) beside one prompt. Together they meet every bucket with block
tables one block wide, a multiple of 16 wide and neither. They write the KV cache of blocks
no request owns yet (start-up), and the cache is zeroed after, as it was allocated.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from stator.engines.native.context import StepContext
from stator.engines.native.kernels import switches

if TYPE_CHECKING:
    from stator.engines.native.model_runner import ModelRunner

log = logging.getLogger(__name__)

# "0" turns the warm-up off (to measure start-up and the first serve without it).
ENV = "STATOR_KERNEL_WARMUP"
# Decode sequences' KV in mixed steps, in blocks: long enough that the decode kernel's
# split count is set by the batch (its occupancy), as in a loaded server.
_DECODE_BLOCKS = 128


@dataclass(frozen=True)
class WarmStep:
    decodes: int  # sequences computing one token each, first in the batch (KV decode_len)
    decode_len: int
    prefill: int  # prompt tokens after them, from position 0, in prompts of <= prompt_len
    logits: bool = True  # whether the prompts end (a logits row each)
    prompt_len: int = 1 << 62

    @property
    def prompts(self) -> list[int]:
        full, rest = divmod(self.prefill, self.prompt_len)
        return [self.prompt_len] * full + ([rest] if rest else [])

    @property
    def tokens(self) -> int:
        return self.decodes + self.prefill


def enabled(runner: ModelRunner) -> bool:
    return (
        runner.device.type == "cuda"
        and bool(getattr(runner.model, "kernel_warmup", False))
        and switches.flag(ENV, True)
    )


def token_counts(max_tokens: int, extra: list[int] | tuple[int, ...] = ()) -> list[int]:
    """1, each power of two p <= max_tokens and p + 1, max_tokens, and each of `extra`
    and one past it: both sides of every bucket boundary that is a power of two or named."""
    counts = {1, max_tokens}
    p = 2
    while p <= max_tokens:
        counts.update((p, p + 1))
        p *= 2
    for t in extra:
        counts.update((t, t + 1))
    return sorted(t for t in counts if 1 <= t <= max_tokens)


def plan(
    max_tokens: int,
    max_seqs: int,
    max_model_len: int,
    block_size: int,
    extra: list[int] | tuple[int, ...] = (),
) -> list[WarmStep]:
    """The warm-up steps (see the module docstring) within the token budget, the sequence
    cap and the model length."""
    # Steps over max_model_len tokens hold several prompts, as the scheduler batches them.
    steps = [WarmStep(0, 0, t, prompt_len=max_model_len) for t in token_counts(max_tokens, extra)]
    if max_tokens > 1:
        steps.append(WarmStep(0, 0, min(max_tokens, max_model_len), logits=False))
    # Decodes' KV: tables _DECODE_BLOCKS wide (a multiple of 16) and one block less, or
    # one block (every sequence short: the kernels' table stride is then 1).
    wide = min(_DECODE_BLOCKS * block_size, max_model_len)
    lens = sorted({wide, max(1, wide - block_size), min(block_size, max_model_len)})
    prompt_of = {lens[0]: min(block_size, max_model_len)}  # short beside short
    n = 1
    while n < max_seqs and n < max_tokens:
        for decode_len in lens:
            prompt = min(max_tokens - n, prompt_of.get(decode_len, 33), max_model_len)
            steps.append(WarmStep(n, decode_len, prompt))
        n *= 2
    return steps


def _inputs(step: WarmStep, block_size: int, num_blocks: int, device: torch.device):
    """The StepInputs of a warm-up step, its sequences on disjoint blocks where the cache
    has enough (wrapped around otherwise: the values written are never read by a request)."""
    from stator.engines.native.model_runner import StepInputs

    lens = [step.decode_len] * step.decodes + step.prompts
    news = [1] * step.decodes + step.prompts
    width = max(-(-n // block_size) for n in lens)
    first = 0
    tables, positions, slots = [], [], []
    for n, new in zip(lens, news, strict=True):
        blocks = [(first + i) % num_blocks for i in range(-(-n // block_size))]
        first += len(blocks)
        tables.append(blocks + [0] * (width - len(blocks)))
        for p in range(n - new, n):
            positions.append(p)
            slots.append(blocks[p // block_size] * block_size + p % block_size)
    rows, offset = [], 0
    for i, new in enumerate(news):
        offset += new
        if i < step.decodes or step.logits:
            rows.append(offset - 1)
    cu = [0]
    for new in news:
        cu.append(cu[-1] + new)

    def t(values) -> torch.Tensor:
        return torch.tensor(values, dtype=torch.long, device=device)

    ctx = StepContext(
        positions=t(positions),
        slot_mapping=t(slots),
        block_tables=t(tables),
        query_lens=t(news),
        seq_lens=t(lens),
        cu_query_lens=t(cu),
        max_query_len=max(news),
        max_seq_len=max(lens),
        block_size=block_size,
        uniform=len(set(news)) == 1 and len(set(lens)) == 1,
        num_leading_single=step.decodes,
    )
    ids = torch.zeros(step.tokens, dtype=torch.long, device=device)
    return StepInputs(input_ids=ids, ctx=ctx, logits_rows=t(rows))


@torch.inference_mode()
def run_steps(runner: ModelRunner, steps: list[WarmStep]) -> None:
    """Execute `steps` on the runner's KV cache, then zero the cache again."""
    for step in steps:
        runner.execute(_inputs(step, runner.block_size, runner.num_blocks, runner.device))
    if runner.kv_pool is not None:
        runner.kv_pool.zero_()


# Every Triton kernel variant this process compiled (or loaded from Triton's disk cache),
# once `watch_compiles` has run: what the warm-up met, and what it missed.
compiled: list[str] = []
_serving = False  # the warm-up is done: a compile now is one it missed


def _on_compile(**hook: Any) -> None:
    # The kernel's name and its specialization (argument types, 16-alignment, constants).
    name = f"{hook['fn'].name} {str(hook['compile']['key'])[:600]}"
    compiled.append(name)
    if _serving:
        log.warning("Triton kernel compiled on the serving path (the warm-up missed it): %s", name)


def watch_compiles() -> bool:
    """Record each kernel variant Triton compiles in this process (`compiled`); False when
    another post-compile hook is installed already (then nothing is recorded)."""
    import triton

    runtime = triton.knobs.runtime
    if runtime.jit_post_compile_hook not in (None, _on_compile):
        return False
    runtime.jit_post_compile_hook = _on_compile
    return True


def warm_up(runner: ModelRunner) -> float | None:
    """Run the warm-up steps if this runner wants them (`enabled`); seconds taken. Kernels
    compiled after it are logged as warnings."""
    global _serving
    if not enabled(runner):
        return None
    watching = watch_compiles()
    before = len(compiled)
    config = runner.config
    extra_of = getattr(runner.model, "warmup_token_counts", None)
    extra = list(extra_of()) if extra_of is not None else []
    steps = plan(
        config.max_num_batched_tokens,
        config.max_num_seqs,
        runner.max_model_len,
        runner.block_size,
        extra,
    )
    start = time.perf_counter()
    run_steps(runner, steps)
    torch.cuda.synchronize(runner.device)
    took = time.perf_counter() - start
    log.info(
        "kernel warm-up: %d eager steps (token counts %s) in %.1f s, %s kernel variants "
        "compiled or loaded",
        len(steps),
        token_counts(config.max_num_batched_tokens, extra),
        took,
        len(compiled) - before if watching else "?",
    )
    _serving = watching
    return took
