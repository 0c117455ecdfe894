"""Skinny matmul y = x @ W.T for a few rows (decode at batch <= 8), split over K.

At one row cuBLAS streams some of Llama's weight shapes at a third of the memory
bandwidth (engines.md §5). Here each program reads a BLOCK_N x (K / SPLIT_K) slab of W once,
in BLOCK_K-wide coalesced rows, multiplies the (padded to 16) rows of x on the tensor
cores, and writes float32 partial sums; the splits are summed afterwards (without a split
the kernel writes the output in x's dtype itself: no extra pass). Which shapes use it is
decided by measurement at start-up (`choose`, timed inside a CUDA graph as decode steps
run it, so launch costs and any extra summing kernel count): a shape keeps cuBLAS unless a
config here is both correct and faster on this GPU.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from stator.engines.native.kernels import pdl
from stator.engines.native.kernels.pdl import pdl_sync

log = logging.getLogger(__name__)

MAX_ROWS = 8


@triton.jit
def _gemv_kernel(
    x_ptr,
    w_ptr,
    b_ptr,
    part_ptr,
    y_ptr,
    M,
    N,
    K,
    x_stride,
    K_PER_SPLIT: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    DIRECT: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    GATED: tl.constexpr,
    PDL: tl.constexpr,
):
    pdl_sync(PDL)
    pid_n = tl.program_id(0)
    split = tl.program_id(1)
    rows = tl.arange(0, 16)
    # GATED: W's rows are [gate; up], N // 2 each; a program takes the same BLOCK_N
    # columns of both, so that one split can write silu(gate) * up itself.
    n_out = N
    if GATED:
        n_out = N // 2
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    col_ok = cols < n_out
    acc = tl.zeros([16, BLOCK_N], tl.float32)
    acc_up = tl.zeros([16, BLOCK_N], tl.float32)
    k_start = split * K_PER_SPLIT
    for k0 in range(k_start, k_start + K_PER_SPLIT, BLOCK_K):
        ks = k0 + tl.arange(0, BLOCK_K)
        k_ok = ks < K
        w = tl.load(
            w_ptr + cols[:, None].to(tl.int64) * K + ks[None, :],
            mask=col_ok[:, None] & k_ok[None, :],
            other=0.0,
        )
        if GATED:
            w_up = tl.load(
                w_ptr + (cols[:, None] + n_out).to(tl.int64) * K + ks[None, :],
                mask=col_ok[:, None] & k_ok[None, :],
                other=0.0,
            )
        x = tl.load(
            x_ptr + rows[:, None] * x_stride + ks[None, :],
            mask=(rows[:, None] < M) & k_ok[None, :],
            other=0.0,
        )
        acc += tl.dot(x, tl.trans(w))
        if GATED:
            acc_up += tl.dot(x, tl.trans(w_up))
    mask = (rows[:, None] < M) & col_ok[None, :]
    if DIRECT:  # one split: the final output, in its dtype
        dtype = y_ptr.dtype.element_ty
        y = y_ptr + rows[:, None].to(tl.int64) * n_out + cols[None, :]
        if GATED:  # rounded as a separate SiLU-and-multiply kernel rounds (elementwise.py)
            gate = acc.to(dtype).to(tl.float32)
            up = acc_up.to(dtype)
            tl.store(y, (gate / (1.0 + tl.exp(-gate))).to(dtype) * up, mask=mask)
        else:
            if HAS_BIAS:
                acc += tl.load(b_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)[None, :]
            tl.store(y, acc.to(dtype), mask=mask)
    else:
        out = part_ptr + (split * M + rows[:, None]).to(tl.int64) * N + cols[None, :]
        tl.store(out, acc, mask=mask)
        if GATED:
            tl.store(out + n_out, acc_up, mask=mask)


@triton.jit
def _sum_splits_kernel(part_ptr, b_ptr, y_ptr, M, N, SPLITS: tl.constexpr,
                       BLOCK: tl.constexpr, HAS_BIAS: tl.constexpr, PDL: tl.constexpr):  # fmt: skip
    """y = the splits' float32 partial sums summed (+ bias), in y's dtype: one launch where
    `sum`, the cast and the bias took three."""
    pdl_sync(PDL)
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    ok = i < M * N
    acc = tl.zeros([BLOCK], tl.float32)
    for s in tl.static_range(SPLITS):
        acc += tl.load(part_ptr + s * M * N + i, mask=ok, other=0.0)
    if HAS_BIAS:
        acc += tl.load(b_ptr + i % N, mask=ok, other=0.0).to(tl.float32)
    tl.store(y_ptr + i, acc.to(y_ptr.dtype.element_ty), mask=ok)


@dataclass(frozen=True)
class GemvConfig:
    block_n: int
    block_k: int
    split_k: int
    num_warps: int = 4


def gemv(
    x: torch.Tensor,
    weight: torch.Tensor,
    config: GemvConfig,
    bias: torch.Tensor | None = None,
    *,
    reduce: bool = True,
    gated: bool = False,
) -> torch.Tensor:
    """x [M <= 8, K] @ weight[N, K].T (+ bias [N]) -> [M, N] in x's dtype. With `reduce`
    False and more than one split: the float32 partial sums [split_k, M, N] instead, bias
    not added, for a consumer that sums them in its own kernel (`kernels/epilogues.py`).
    `gated` (weight = [gate; up], no bias): silu(gate) * up [M, N / 2] with one split;
    with more, only the partial sums (`reduce` False), which `epilogues.silu_mul` takes."""
    m, k = x.shape
    n = weight.shape[0]
    if m > MAX_ROWS or x.stride(1) != 1 or not weight.is_contiguous():
        raise ValueError("gemv needs at most 8 contiguous rows and a contiguous weight")
    direct = config.split_k == 1
    if gated and (bias is not None or n % 2 or (reduce and not direct)):
        raise ValueError("a gated gemv has no bias, an even N, and leaves splits unsummed")
    per_split = triton.cdiv(triton.cdiv(k, config.split_k), config.block_k) * config.block_k
    n_out = n // 2 if gated else n
    y = torch.empty((m, n_out), dtype=x.dtype, device=x.device)
    parts = (
        y if direct else torch.empty((config.split_k, m, n), dtype=torch.float32, device=x.device)
    )
    grid = (triton.cdiv(n_out, config.block_n), config.split_k)
    has_bias = bias is not None
    _gemv_kernel[grid](
        x,
        weight,
        bias if has_bias else weight,
        parts,
        y,
        m,
        n,
        k,
        x.stride(0),
        K_PER_SPLIT=per_split,
        BLOCK_N=config.block_n,
        BLOCK_K=config.block_k,
        DIRECT=direct,
        HAS_BIAS=has_bias,
        GATED=gated,
        PDL=pdl.enabled(x),
        launch_pdl=pdl.enabled(x),
        num_warps=config.num_warps,
        num_stages=4,
    )
    if not direct and not reduce:
        return parts
    if not direct:
        sum_splits(parts, bias, y)
    return y


def sum_splits(parts: torch.Tensor, bias: torch.Tensor | None, out: torch.Tensor) -> torch.Tensor:
    """out [M, N] = parts [S, M, N] (float32) summed over S (+ bias), in out's dtype."""
    splits, m, n = parts.shape
    block = 1024
    _sum_splits_kernel[(triton.cdiv(m * n, block),)](
        parts, bias if bias is not None else parts, out, m, n, SPLITS=splits, BLOCK=block,
        HAS_BIAS=bias is not None, PDL=pdl.enabled(parts), launch_pdl=pdl.enabled(parts),
        num_warps=4,
    )  # fmt: skip
    return out


def _graph_time(fn, calls: int = 10, reps: int = 20) -> float:
    """ms per call of `fn`, replayed from a CUDA graph of `calls` calls (as in a decode
    graph: no launch gaps, extra kernels counted)."""
    fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            fn()
    graph.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        graph.replay()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / (reps * calls)


def candidates(n: int, k: int, sms: int) -> list[GemvConfig]:
    out = []
    for block_n in (16, 32, 64):
        for block_k in (128, 256):
            tiles = triton.cdiv(n, block_n)
            split = max(1, min(triton.cdiv(2 * sms, tiles), k // (2 * block_k)))
            for warps in (4, 8):
                out.append(GemvConfig(block_n, block_k, split, warps))
                if split > 1:
                    out.append(GemvConfig(block_n, block_k, 1, warps))
    return out


@torch.no_grad()
def choose(
    weight: torch.Tensor, bias: torch.Tensor | None = None, epilogue: str = ""
) -> GemvConfig | None:
    """The fastest correct config for one row against `weight` (and its bias, added in
    the kernels as cuBLAS adds it in its epilogue), or None where cuBLAS is at least as
    fast. `epilogue`: how the layer consumes the output (`epilogues.py`), which decides
    what is timed: "" the summed output; "parts" the partial sums (the consumer's kernel
    sums them); "gated" silu(gate) * up, against cuBLAS plus the SiLU-and-multiply kernel
    (with more than one split: the partials, then `epilogues.silu_mul`)."""
    from stator.engines.native.kernels import elementwise, epilogues

    n, k = weight.shape
    sms = torch.cuda.get_device_properties(weight.device).multi_processor_count
    x = torch.randn(1, k, device=weight.device, dtype=weight.dtype)
    gated = epilogue == "gated"

    def cublas() -> torch.Tensor:
        y = torch.nn.functional.linear(x, weight, bias)
        return elementwise.silu_mul(y) if gated else y

    def run(cfg: GemvConfig) -> torch.Tensor:
        if epilogue == "" or cfg.split_k == 1:
            return gemv(x, weight, cfg, bias, gated=gated)
        parts = gemv(x, weight, cfg, bias, reduce=False, gated=gated)
        return epilogues.silu_mul(parts, cfg.split_k, x.dtype) if gated else parts

    def finished(cfg: GemvConfig) -> torch.Tensor:
        out = run(cfg)
        if epilogue == "parts" and cfg.split_k > 1:
            out = sum_splits(out, bias, torch.empty_like(ref, dtype=x.dtype))
        return out.float()

    ref = cublas().float()
    best, best_ms = None, _graph_time(cublas)
    for cfg in candidates(n // 2 if gated else n, k, sms):
        try:
            out = finished(cfg)
            if not torch.isfinite(out).all():
                continue
            if float((out - ref).norm() / ref.norm().clamp_min(1e-6)) > 1e-2:
                continue
            # "parts": the consumer's kernel runs either way; only the GEMV is timed.
            ms = _graph_time(lambda cfg=cfg: run(cfg))
        except Exception as exc:  # a config this GPU cannot compile: skip it
            log.debug("gemv config %s failed: %s", cfg, exc)
            continue
        if ms < best_ms * 0.98:
            best, best_ms = cfg, ms
    return best
