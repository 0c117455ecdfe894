"""Paged prefill/extend attention: each sequence computes `query_len` new tokens on top of a
cached prefix; every key (prefix and new, already stored) is read from the paged cache.

Grid (q head, query tile, sequence). A tile of BLOCK_M query rows at positions
prefix + i attends causally (bottom-right aligned: query i sees keys <= prefix + i), walking
key tiles of BLOCK_N tokens up to its last row's position, each token's page looked up in
the block table; online softmax in float32 (base 2). Rows and tiles that see no key are
guarded, so padding never makes NaN.

Hooks: `window` > 0 lets a query see only the last `window` keys (itself included) and
skips key tiles before the window; `sinks` [Hq] float32 logits start the running max at the
sink with a running sum of 1 (a column with no value).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

_LOG2E = 1.4426950408889634


def _precision(q: torch.Tensor) -> str:
    """float32 (tests): exact products; tf32's 10-bit mantissa would flip near-ties."""
    return "ieee" if q.dtype == torch.float32 else "tf32"


# The block table's width and the per-sequence tensors' alignment vary with each mixed
# step (they are sliced past its decodes): not specialized, so one compile serves them all
# (the start-up warm-up, kernel_warmup.py, meets each variant once).
@triton.jit(
    do_not_specialize=["bt_stride"],
    do_not_specialize_on_alignment=["block_table_ptr", "cu_query_lens_ptr", "seq_lens_ptr"],
)
def _extend_kernel(
    q_ptr,
    k_cache_ptr,
    v_cache_ptr,
    block_table_ptr,
    cu_query_lens_ptr,
    seq_lens_ptr,
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
    HEAD_DIM: tl.constexpr,
    PAGE: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    HAS_SINKS: tl.constexpr,
    PRECISION: tl.constexpr,
):
    h = tl.program_id(0)  # fastest: the q heads of a GQA group share K/V tiles in L2
    tile = tl.program_id(1)
    b = tl.program_id(2)
    q_start = tl.load(cu_query_lens_ptr + b).to(tl.int32)
    q_len = tl.load(cu_query_lens_ptr + b + 1).to(tl.int32) - q_start
    if tile * BLOCK_M >= q_len:
        return
    seq_len = tl.load(seq_lens_ptr + b).to(tl.int32)
    prefix = seq_len - q_len
    rows = tile * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = rows < q_len
    q_pos = prefix + rows
    dims = tl.arange(0, HEAD_DIM)
    token_rows = (q_start + rows).to(tl.int64)
    q = tl.load(
        q_ptr + token_rows[:, None] * q_stride_t + h * q_stride_h + dims[None, :],
        mask=row_ok[:, None],
        other=0.0,
    )
    kvh = h // GROUP
    tok_stride = NUM_KV_HEADS * HEAD_DIM
    hi = tl.minimum(seq_len, prefix + (tile + 1) * BLOCK_M)
    lo = tl.where(window > 0, tl.maximum(prefix + tile * BLOCK_M - window + 1, 0), 0)
    lo = (lo // BLOCK_N) * BLOCK_N
    if HAS_SINKS:
        sink = tl.load(sinks_ptr + h).to(tl.float32) * 1.4426950408889634
        m_i = tl.zeros([BLOCK_M], tl.float32) + sink
        l_i = tl.zeros([BLOCK_M], tl.float32) + 1.0
    else:
        m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
        l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    for n0 in range(lo, hi, BLOCK_N):
        cols = n0 + tl.arange(0, BLOCK_N)
        ok = cols < hi
        page = tl.load(
            block_table_ptr + b.to(tl.int64) * bt_stride + cols // PAGE, mask=ok, other=0
        )
        token = page.to(tl.int64) * PAGE + cols % PAGE
        offs = token[:, None] * tok_stride + kvh * HEAD_DIM + dims[None, :]
        k = tl.load(k_cache_ptr + offs, mask=ok[:, None], other=0.0)
        s = tl.dot(q, tl.trans(k), input_precision=PRECISION) * scale_log2
        visible = ok[None, :] & (cols[None, :] <= q_pos[:, None])
        visible &= (window <= 0) | (cols[None, :] > q_pos[:, None] - window)
        s = tl.where(visible, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp2(m_i - m_safe)
        p = tl.exp2(s - m_safe[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(v_cache_ptr + offs, mask=ok[:, None], other=0.0)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
        m_i = m_new
    out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
    tl.store(
        out_ptr + token_rows[:, None] * out_stride_t + h * out_stride_h + dims[None, :],
        out.to(out_ptr.dtype.element_ty),
        mask=row_ok[:, None],
    )


def paged_extend_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_table: torch.Tensor,
    cu_query_lens: torch.Tensor,
    seq_lens: torch.Tensor,
    max_query_len: int,
    scale: float,
    *,
    window: int = 0,
    sinks: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """q [T, Hq, D] flat over the batch (sequence b owns rows cu[b]:cu[b+1]); caches
    [blocks, page, Hkv, D] already holding this step's keys; seq_lens [B] keys per sequence
    after this step."""
    tokens, num_heads, head_dim = q.shape
    _, page, num_kv_heads, _ = k_cache.shape
    if q.stride(2) != 1:
        raise ValueError("q's last dimension must be contiguous")
    if out is None:
        out = torch.empty_like(q)
    batch = seq_lens.shape[0]
    if tokens == 0 or batch == 0:
        return out
    block_m = 64 if max_query_len > 16 else 16
    grid = (num_heads, triton.cdiv(max_query_len, block_m), batch)
    _extend_kernel[grid](
        q,
        k_cache,
        v_cache,
        block_table,
        cu_query_lens,
        seq_lens,
        sinks if sinks is not None else q,
        out,
        q.stride(0),
        q.stride(1),
        out.stride(0),
        out.stride(1),
        block_table.stride(0),
        scale * _LOG2E,
        window,
        NUM_KV_HEADS=num_kv_heads,
        GROUP=num_heads // num_kv_heads,
        HEAD_DIM=head_dim,
        PAGE=page,
        BLOCK_M=block_m,
        BLOCK_N=64,
        HAS_SINKS=sinks is not None,
        PRECISION=_precision(q),
        num_warps=4,
        num_stages=2,
    )
    return out
