"""Paged decode attention, split-K ("flash decoding"): one query token per sequence.

Stage 1, grid (batch, kv_head, split): the GQA group of query heads that share a KV head is
packed into the rows of one tile (padded to 16, the smallest `tl.dot`), so every key and
value is read from memory once per group. Each program walks its share of the sequence's
tokens in BLOCK_N tiles, looking up each token's page in the block table, with an online
softmax in float32 (base 2), and writes a partial output and its log-sum-exp.
Stage 2, grid (batch * q_head): merges the splits by their log-sum-exp; attention sinks
(one logit per head, no value) only add to the denominator, so they live here. With one
split there is nothing to merge: stage 1 writes the output (sinks included) and stage 2
does not run, which saves a launch and a float32 round trip of every row.

Hooks: `window` > 0 keeps the last `window` keys (the query itself included); `sinks`
[Hq] float32 logits. A sequence of length 0 (a padded CUDA-graph row) yields zeros.
The number of splits is a launch constant, so a CUDA graph can fix it per batch size; the
split length adapts to each sequence's length inside the kernel. The tile (`DecodeTile`:
tokens per tile, warps, pipeline stages, whether the next tile's pages are loaded a tile
ahead) is a launch choice too: `tile_for` picks it by head size and split count, and
`STATOR_DECODE_TILE` ("BLOCK_N,WARPS,STAGES,PREFETCH") forces one.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from stator.engines.native.kernels import pdl, switches
from stator.engines.native.kernels.pdl import pdl_sync

_LOG2E = 1.4426950408889634


@dataclass(frozen=True)
class DecodeTile:
    """How the split kernel walks a sequence: `block_n` tokens a tile (a power of two, at
    least 16: the smallest `tl.dot`), `warps` and pipeline `stages` of the launch, and
    `prefetch`: load the next tile's page numbers while this tile computes, so the key and
    value loads do not wait on the table load that gives their addresses."""

    block_n: int = 64
    warps: int = 4
    stages: int = 2
    prefetch: bool = False

    def __post_init__(self) -> None:
        n = self.block_n
        if n < 16 or n & (n - 1) or self.warps not in (1, 2, 4, 8) or self.stages < 1:
            raise ValueError(f"bad decode tile {self}")

    @classmethod
    def parse(cls, text: str) -> DecodeTile:
        """Text as STATOR_DECODE_TILE takes it: "BLOCK_N,WARPS,STAGES,PREFETCH" ("64,4,2,0")."""
        try:
            n, w, st, pf = (int(x) for x in text.split(","))
        except ValueError:
            raise ValueError(
                f"a decode tile is BLOCK_N,WARPS,STAGES,PREFETCH (e.g. 64,4,2,0), not {text!r}"
            ) from None
        if pf not in (0, 1):
            raise ValueError(f"a decode tile's PREFETCH is 0 or 1, not {text!r}")
        return cls(n, w, st, bool(pf))

    def __str__(self) -> str:
        return f"{self.block_n},{self.warps},{self.stages},{int(self.prefetch)}"


#: A tile forced for every launch (env STATOR_DECODE_TILE, "BLOCK_N,WARPS,STAGES,PREFETCH");
#: None: `tile_for` picks by shape.
TILE = switches.parsed("STATOR_DECODE_TILE", DecodeTile.parse)
BLOCK_N = 64  # the tiles `tile_for` picks; a forced tile's own length bounds the splits
_SHORT = DecodeTile(64, 4, 2, False)
_LONG = DecodeTile(64, 4, 3, True)


def tile_for(head_dim: int, num_splits: int, elem_bytes: int = 2) -> DecodeTile:
    """The forced tile if any; else, for 16-bit heads of 128 walked in 4 splits or fewer
    (long walks: large batches), three pipeline stages with the next tile's pages loaded a
    tile ahead; two stages otherwise (other head sizes and float32 are not measured, and
    their deeper pipeline could outgrow shared memory). Measured on an H100, the kernel
    alone over ShareGPT-like and heavy contexts (`benchmarks/decode_tiles.py`, 2026-11-28;
    µs a layer, two stages vs three with the pages ahead): 32 q / 8 KV heads of 128 at 256
    sequences, 1 split: 200.3 vs 166.2 (heavy contexts 294.1 vs 284.9); 128 sequences, 2
    splits: 90.4 vs 82.4; 64, 4 splits: 52.0 vs 49.5; but 16 sequences, 16 splits (a tile
    or two each): 19.3 vs 23.9. GPT-OSS's 64 q / 8 KV heads of 64 (window 128): 27.7 vs
    29.1 at 256, 15.2 vs 17.0 at 64."""
    if TILE is not None:
        return TILE
    deep = head_dim == 128 and num_splits <= 4 and elem_bytes == 2
    return _LONG if deep else _SHORT


def _precision(q: torch.Tensor) -> str:
    """float32 (tests): exact products; tf32's 10-bit mantissa would flip near-ties."""
    return "ieee" if q.dtype == torch.float32 else "tf32"


@triton.jit(do_not_specialize=["bt_stride"])  # the table's width varies in mixed steps
def _decode_split_kernel(
    q_ptr,
    k_cache_ptr,
    v_cache_ptr,
    block_table_ptr,
    seq_lens_ptr,
    part_out_ptr,
    part_lse_ptr,
    sinks_ptr,
    out_ptr,
    q_stride_t,
    q_stride_h,
    out_stride_t,
    out_stride_h,
    bt_stride,
    scale_log2,
    window,
    NUM_KV_HEADS: tl.constexpr,
    GROUP: tl.constexpr,
    GROUP_PAD: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    PAGE: tl.constexpr,
    BLOCK_N: tl.constexpr,
    NUM_SPLITS: tl.constexpr,
    PRECISION: tl.constexpr,
    PREFETCH: tl.constexpr,
    SINGLE_PASS: tl.constexpr,
    HAS_SINKS: tl.constexpr,
    PDL: tl.constexpr,
):
    pdl_sync(PDL)
    b = tl.program_id(0)
    kvh = tl.program_id(1)
    split = tl.program_id(2)
    seq_len = tl.load(seq_lens_ptr + b).to(tl.int32)
    start = tl.where(window > 0, tl.maximum(seq_len - window, 0), 0)
    per_split = tl.cdiv(tl.cdiv(seq_len - start, NUM_SPLITS), BLOCK_N) * BLOCK_N
    lo = start + split * per_split
    hi = tl.minimum(lo + per_split, seq_len)

    rows = tl.arange(0, GROUP_PAD)
    dims = tl.arange(0, HEAD_DIM)
    row_ok = rows < GROUP
    heads = kvh * GROUP + rows
    q = tl.load(
        q_ptr + b.to(tl.int64) * q_stride_t + heads[:, None] * q_stride_h + dims[None, :],
        mask=row_ok[:, None],
        other=0.0,
    )
    tok_stride = NUM_KV_HEADS * HEAD_DIM
    m_i = tl.full([GROUP_PAD], float("-inf"), tl.float32)
    l_i = tl.zeros([GROUP_PAD], tl.float32)
    acc = tl.zeros([GROUP_PAD, HEAD_DIM], tl.float32)
    table_row = block_table_ptr + b.to(tl.int64) * bt_stride
    if PREFETCH:  # the first tile's pages; each iteration loads the next tile's
        first = lo + tl.arange(0, BLOCK_N)
        next_page = tl.load(table_row + first // PAGE, mask=first < hi, other=0)
    for n0 in range(lo, hi, BLOCK_N):
        cols = n0 + tl.arange(0, BLOCK_N)
        ok = cols < hi
        if PREFETCH:
            page = next_page
            ahead = cols + BLOCK_N
            next_page = tl.load(table_row + ahead // PAGE, mask=ahead < hi, other=0)
        else:
            page = tl.load(table_row + cols // PAGE, mask=ok, other=0)
        token = page.to(tl.int64) * PAGE + cols % PAGE
        offs = token[:, None] * tok_stride + kvh * HEAD_DIM + dims[None, :]
        k = tl.load(k_cache_ptr + offs, mask=ok[:, None], other=0.0)
        s = tl.dot(q, tl.trans(k), input_precision=PRECISION) * scale_log2
        s = tl.where(ok[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(v_cache_ptr + offs, mask=ok[:, None], other=0.0)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
        m_i = m_new
    has = l_i > 0
    if SINGLE_PASS:  # one split: the output itself, sinks in its denominator, no merge
        if HAS_SINKS:
            sink = tl.load(sinks_ptr + heads, mask=row_ok, other=0.0).to(tl.float32)
            sink = sink * 1.4426950408889634
            m = tl.maximum(m_i, sink)
            keep = tl.exp2(m_i - m)  # 0 for a row without keys (m_i = -inf)
            l_i = l_i * keep + tl.exp2(sink - m)
            acc = acc * keep[:, None]
            has = l_i > 0
        final = tl.where(has[:, None], acc / tl.where(has, l_i, 1.0)[:, None], 0.0)
        tl.store(
            out_ptr + b.to(tl.int64) * out_stride_t + heads[:, None] * out_stride_h + dims[None, :],
            final.to(out_ptr.dtype.element_ty),
            mask=row_ok[:, None],
        )
    else:
        out = tl.where(has[:, None], acc / tl.where(has, l_i, 1.0)[:, None], 0.0)
        lse = tl.where(has, m_i + tl.log2(tl.where(has, l_i, 1.0)), float("-inf"))
        row_index = (b * NUM_KV_HEADS * GROUP + heads) * NUM_SPLITS + split  # [B, Hq, S]
        tl.store(part_lse_ptr + row_index, lse, mask=row_ok)
        tl.store(
            part_out_ptr + row_index[:, None].to(tl.int64) * HEAD_DIM + dims[None, :],
            out,
            mask=row_ok[:, None],
        )


@triton.jit
def _decode_merge_kernel(
    part_out_ptr,
    part_lse_ptr,
    sinks_ptr,
    out_ptr,
    out_stride_t,
    out_stride_h,
    NUM_HEADS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    NUM_SPLITS: tl.constexpr,
    SPLITS_PAD: tl.constexpr,
    HAS_SINKS: tl.constexpr,
    PDL: tl.constexpr,
):
    pdl_sync(PDL)
    pid = tl.program_id(0)  # b * Hq + h
    b = pid // NUM_HEADS
    h = pid % NUM_HEADS
    splits = tl.arange(0, SPLITS_PAD)
    split_ok = splits < NUM_SPLITS
    dims = tl.arange(0, HEAD_DIM)
    lse = tl.load(part_lse_ptr + pid * NUM_SPLITS + splits, mask=split_ok, other=float("-inf"))
    m = tl.max(lse, 0)
    if HAS_SINKS:
        sink = tl.load(sinks_ptr + h).to(tl.float32) * 1.4426950408889634
        m = tl.maximum(m, sink)
    m_safe = tl.where(m == float("-inf"), 0.0, m)
    w = tl.exp2(lse - m_safe)
    denom = tl.sum(w, 0)
    if HAS_SINKS:
        denom += tl.exp2(sink - m_safe)
    parts = tl.load(
        part_out_ptr + (pid * NUM_SPLITS + splits)[:, None].to(tl.int64) * HEAD_DIM + dims[None, :],
        mask=split_ok[:, None],
        other=0.0,
    )
    out = tl.sum(parts * w[:, None], 0) / tl.where(denom > 0, denom, 1.0)
    tl.store(
        out_ptr + b.to(tl.int64) * out_stride_t + h * out_stride_h + dims,
        out.to(out_ptr.dtype.element_ty),
    )


#: Programs per SM `default_num_splits` aims at (env STATOR_DECODE_PROGRAMS_PER_SM). 16
#: splits the sequences of mid batches (see `num_splits_for`): on an H100, engine alone,
#: ShareGPT-like lof, 16 gave 10,221 output tok/s against 9,798 with the earlier 2 in the
#: same call (decode steps of 9-32 sequences 4.88 s vs 5.20 s); batch 1 and batches of
#: 128+ get the same split count either way.
PROGRAMS_PER_SM = switches.positive_int("STATOR_DECODE_PROGRAMS_PER_SM", 16)
#: The fewest splits of a sequence longer than one tile (env STATOR_DECODE_MIN_SPLITS), at
#: any batch: with one split a program walks its whole sequence and the longest of the batch
#: sets the step even when the grid fills the GPU many times over.
MIN_SPLITS = switches.positive_int("STATOR_DECODE_MIN_SPLITS", 1)


def default_num_splits(batch: int, num_kv_heads: int, max_seq_len: int) -> int:
    """`num_splits_for` on this device's SM count."""
    sms = torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count
    return num_splits_for(batch, num_kv_heads, max_seq_len, sms)


def num_splits_for(
    batch: int,
    num_kv_heads: int,
    max_seq_len: int,
    sms: int,
    programs_per_sm: int | None = None,
    block_n: int | None = None,
    min_splits: int | None = None,
) -> int:
    """About `programs_per_sm` (default PROGRAMS_PER_SM) programs per SM, no split shorter
    than one tile, a power of two up to 32. Why more than one wave may pay: a program walks
    its sequence's share tile by tile, so with one split per sequence the longest sequence
    of the batch sets the step's time. On an H100 run of ShareGPT-like lengths
    (`benchmarks/step_ledger.py`, 2026-11-28), decode steps of 9-32 sequences at ~1,300
    tokens each took 142 ms per million tokens of context (44 at the copy rate) with 2
    programs per SM, which gives one split from 17 sequences up; batches of 256 read their
    KV at the copy rate."""
    per_sm = PROGRAMS_PER_SM if programs_per_sm is None else programs_per_sm
    floor = MIN_SPLITS if min_splits is None else min_splits
    by_occupancy = max(floor, (per_sm * sms) // max(1, batch * num_kv_heads))
    tile_len = block_n or (TILE.block_n if TILE is not None else BLOCK_N)
    by_length = max(1, math.ceil(max_seq_len / tile_len))
    # A power of two: NUM_SPLITS is a constexpr, so each value is a compile; eager mixed
    # steps would otherwise meet any of 1..32 (kernel_warmup.py compiles all six).
    splits = min(by_occupancy, by_length, 32)
    return 1 << (splits.bit_length() - 1)


def paged_decode_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_table: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    *,
    num_splits: int,
    window: int = 0,
    sinks: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
    tile: DecodeTile | None = None,
    single_pass: bool | None = None,
) -> torch.Tensor:
    """q [B, Hq, D] (one token per sequence); caches [blocks, page, Hkv, D]; block_table
    [B, >= ceil(len / page)]; seq_lens [B] keys per sequence (this token's included);
    `tile` (default `tile_for` the shape) how the split kernel walks them; `single_pass`
    (default: with one split) the split kernel writes the output itself, no merge runs."""
    single = num_splits == 1 if single_pass is None else single_pass
    if single and num_splits != 1:
        raise ValueError("a single pass needs one split")
    batch, num_heads, head_dim = q.shape
    _, page, num_kv_heads, _ = k_cache.shape
    tile = tile_for(head_dim, num_splits, q.element_size()) if tile is None else tile
    if q.stride(2) != 1:
        raise ValueError("q's last dimension must be contiguous")
    group = num_heads // num_kv_heads
    if out is None:
        out = torch.empty_like(q)
    parts = 0 if single else batch  # a single pass writes no partial results
    part_out = torch.empty(
        (parts, num_heads, num_splits, head_dim), dtype=torch.float32, device=q.device
    )
    part_lse = torch.empty((parts, num_heads, num_splits), dtype=torch.float32, device=q.device)
    if batch == 0:
        return out
    _decode_split_kernel[(batch, num_kv_heads, num_splits)](
        q,
        k_cache,
        v_cache,
        block_table,
        seq_lens,
        part_out,
        part_lse,
        sinks if sinks is not None else part_lse,
        out,
        q.stride(0),
        q.stride(1),
        out.stride(0),
        out.stride(1),
        block_table.stride(0),
        scale * _LOG2E,
        window,
        NUM_KV_HEADS=num_kv_heads,
        GROUP=group,
        GROUP_PAD=max(16, triton.next_power_of_2(group)),
        HEAD_DIM=head_dim,
        PAGE=page,
        BLOCK_N=tile.block_n,
        NUM_SPLITS=num_splits,
        PRECISION=_precision(q),
        PREFETCH=tile.prefetch,
        SINGLE_PASS=single,
        HAS_SINKS=sinks is not None,
        PDL=pdl.enabled(q),
        launch_pdl=pdl.enabled(q),
        num_warps=tile.warps,
        num_stages=tile.stages,
    )
    if single:
        return out
    _decode_merge_kernel[(batch * num_heads,)](
        part_out,
        part_lse,
        sinks if sinks is not None else part_lse,
        out,
        out.stride(0),
        out.stride(1),
        NUM_HEADS=num_heads,
        HEAD_DIM=head_dim,
        NUM_SPLITS=num_splits,
        SPLITS_PAD=triton.next_power_of_2(num_splits),
        HAS_SINKS=sinks is not None,
        PDL=pdl.enabled(q),
        launch_pdl=pdl.enabled(q),
        num_warps=4,
    )
    return out
