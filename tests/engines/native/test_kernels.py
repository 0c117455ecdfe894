"""The Triton kernels against a float32 PyTorch reference (CUDA only): random inputs, odd
lengths, GQA groups, windows, sinks, padded rows, and outputs poisoned with NaN first so
that an unwritten element fails."""

from __future__ import annotations

import math

import pytest
import torch

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]

DEV = "cuda"


def _paged_cache(lens, page, hkv, dim, seed):
    """Random caches with each sequence's tokens scattered over shuffled pages."""
    gen = torch.Generator(device=DEV).manual_seed(seed)
    pages_per = [math.ceil(n / page) for n in lens]
    num_blocks = sum(pages_per) + 3
    k_cache = torch.randn(num_blocks, page, hkv, dim, device=DEV, generator=gen).bfloat16()
    v_cache = torch.randn(num_blocks, page, hkv, dim, device=DEV, generator=gen).bfloat16()
    order = torch.randperm(num_blocks, device=DEV, generator=gen).tolist()
    width = max(pages_per) + 2
    table = torch.zeros(len(lens), width, dtype=torch.long, device=DEV)
    used = 0
    for i, n in enumerate(pages_per):
        table[i, :n] = torch.tensor(order[used : used + n])
        used += n
    return k_cache, v_cache, table


def _gather(cache, table_row, length):
    page = cache.shape[1]
    blocks = table_row[: math.ceil(length / page)]
    return cache[blocks].flatten(0, 1)[:length].float()  # [L, Hkv, D]


def _reference(q, k_cache, v_cache, table, cu, lens, scale, window=0, sinks=None):
    """q [T, Hq, D]; sequence b's queries are its last q_len positions."""
    out = torch.empty(q.shape, dtype=torch.float32, device=DEV)
    hq, hkv = q.shape[1], k_cache.shape[2]
    for b, length in enumerate(lens):
        rows = slice(int(cu[b]), int(cu[b + 1]))
        qb = q[rows].float()  # [n, Hq, D]
        n = qb.shape[0]
        k = _gather(k_cache, table[b], length).repeat_interleave(hq // hkv, 1)
        v = _gather(v_cache, table[b], length).repeat_interleave(hq // hkv, 1)
        s = torch.einsum("qhd,khd->hqk", qb, k) * scale
        qpos = torch.arange(length - n, length, device=DEV)[:, None]
        kpos = torch.arange(length, device=DEV)[None, :]
        visible = kpos <= qpos
        if window:
            visible &= kpos > qpos - window
        s = s.masked_fill(~visible, float("-inf"))
        if sinks is not None:
            s = torch.cat([s, sinks.float()[:, None, None].expand(hq, n, 1)], dim=-1)
        p = torch.softmax(s, dim=-1)[..., :length]
        out[rows] = torch.einsum("hqk,khd->qhd", p, v)
    return out


def _rel_err(out, ref):
    assert not torch.isnan(out).any(), "NaN in the output (unwritten element?)"
    return float((out.float() - ref).norm() / ref.norm())


def test_store_kv_writes_slots_and_skips_negative():
    from stator.engines.native.kernels.store_kv import store_kv

    tokens, hkv, dim, page = 37, 3, 40, 16
    k_cache = torch.full((8, page, hkv, dim), float("nan"), device=DEV).bfloat16()
    v_cache = k_cache.clone()
    qkv = torch.randn(tokens, 5 * hkv * dim, device=DEV).bfloat16()  # strided views, as the model
    k = qkv[:, : hkv * dim].view(tokens, hkv, dim)
    v = qkv[:, 2 * hkv * dim : 3 * hkv * dim].view(tokens, hkv, dim)
    slots = torch.randperm(8 * page, device=DEV)[:tokens]
    slots[5] = -1
    store_kv(k, v, k_cache, v_cache, slots)
    flat_k, flat_v = k_cache.view(-1, hkv, dim), v_cache.view(-1, hkv, dim)
    keep = slots >= 0
    assert torch.equal(flat_k[slots[keep]], k[keep])
    assert torch.equal(flat_v[slots[keep]], v[keep])
    written = torch.zeros(8 * page, dtype=torch.bool, device=DEV)
    written[slots[keep]] = True
    assert torch.isnan(flat_k[~written].float()).all()  # nothing else touched


@pytest.mark.parametrize("group", [1, 4, 7])
@pytest.mark.parametrize("page", [16, 64])
@pytest.mark.parametrize("window", [0, 37])
@pytest.mark.parametrize("with_sinks", [False, True])
def test_decode_matches_reference(group, page, window, with_sinks):
    from stator.engines.native.kernels.decode_attention import paged_decode_attention

    hkv, dim = 2, 128
    lens = [1, 17, 300, 1023, 64, 2049]
    k_cache, v_cache, table = _paged_cache(lens, page, hkv, dim, seed=group + page)
    q = torch.randn(len(lens), hkv * group, dim, device=DEV).bfloat16()
    seq_lens = torch.tensor(lens, device=DEV)
    sinks = torch.randn(hkv * group, device=DEV) * 2 if with_sinks else None
    cu = torch.arange(len(lens) + 1)
    ref = _reference(q, k_cache, v_cache, table, cu, lens, dim**-0.5, window, sinks)
    for splits in (1, 5, 16):
        out = torch.full_like(q, float("nan"))
        paged_decode_attention(
            q, k_cache, v_cache, table, seq_lens, dim**-0.5,
            num_splits=splits, window=window, sinks=sinks, out=out,
        )  # fmt: skip
        assert _rel_err(out, ref) < 2e-2, splits


def test_decode_padded_rows_give_zeros():
    from stator.engines.native.kernels.decode_attention import paged_decode_attention

    k_cache, v_cache, table = _paged_cache([50, 1], 16, 2, 64, seed=1)
    q = torch.randn(3, 8, 64, device=DEV).bfloat16()
    table = torch.cat([table, table[:1]])
    seq_lens = torch.tensor([50, 0, 0], device=DEV)
    out = paged_decode_attention(q, k_cache, v_cache, table, seq_lens, 0.125, num_splits=4)
    assert torch.isfinite(out.float()).all()
    assert (out[1:] == 0).all()


@pytest.mark.parametrize("group", [1, 4])
@pytest.mark.parametrize("window", [0, 29])
@pytest.mark.parametrize("with_sinks", [False, True])
def test_extend_matches_reference(group, window, with_sinks):
    from stator.engines.native.kernels.extend_attention import paged_extend_attention

    hkv, dim, page = 2, 128, 16
    # (cached prefix, new tokens): whole prompts, prefix hits, decode rows, odd sizes.
    shapes = [(0, 1), (0, 77), (48, 33), (5, 1), (130, 200), (0, 16), (511, 2)]
    lens = [p + n for p, n in shapes]
    k_cache, v_cache, table = _paged_cache(lens, page, hkv, dim, seed=7 + group)
    q_lens = [n for _, n in shapes]
    cu = torch.zeros(len(shapes) + 1, dtype=torch.long)
    cu[1:] = torch.tensor(q_lens).cumsum(0)
    q = torch.randn(int(cu[-1]), hkv * group, dim, device=DEV).bfloat16()
    sinks = torch.randn(hkv * group, device=DEV) * 2 if with_sinks else None
    ref = _reference(q, k_cache, v_cache, table, cu, lens, dim**-0.5, window, sinks)
    out = torch.full_like(q, float("nan"))
    paged_extend_attention(
        q, k_cache, v_cache, table, cu.to(DEV), torch.tensor(lens, device=DEV),
        max(q_lens), dim**-0.5, window=window, sinks=sinks, out=out,
    )  # fmt: skip
    assert _rel_err(out, ref) < 2e-2


def test_triton_backend_matches_torch_backend_in_the_engine(llama):
    """The whole engine, bf16 on CUDA: Triton and gather+SDPA backends agree on greedy
    tokens for a mixed batch with prefix-cache hits and chunked prefill."""
    from stator.engines.native.attention import TorchAttention
    from stator.engines.native.config import NativeConfig
    from stator.engines.native.engine_core import EngineCore
    from stator.engines.native.triton_attention import TritonAttention
    from tests.engines.native.models import greedy_request, prompt, run_all, tokens_of

    model_dir, _ = llama
    results = []
    for backend in (TorchAttention(), TritonAttention()):
        config = NativeConfig(
            device="cuda", dtype="float32", kv_cache_memory="8MiB", max_num_batched_tokens=48
        )
        core = EngineCore(config, model_dir, backend=backend)
        reqs = [greedy_request(f"r{i}", prompt(i, 5 + 23 * i), 20) for i in range(4)]
        first = run_all(core, reqs)
        again = run_all(core, [greedy_request("x", prompt(2, 51), 20)])
        results.append(({k: tokens_of(v) for k, v in first.items()}, tokens_of(again["x"])))
    assert results[0] == results[1]


@pytest.mark.parametrize("with_residual", [False, True])
def test_rms_norm_matches_torch(with_residual):
    from stator.engines.native.kernels.elementwise import rms_norm

    x = torch.randn(37, 4096 + 40, device=DEV).bfloat16()
    w = (torch.rand(x.shape[1], device=DEV) + 0.5).bfloat16()
    res = torch.randn_like(x) if with_residual else None
    base = x if res is None else (res + x)
    h = base.float()
    ref = w * (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-5)).bfloat16()
    res_in = None if res is None else res.clone()
    out = rms_norm(x, w, 1e-5, res_in)
    assert _rel_err(out, ref.float()) < 1e-2
    if res_in is not None:
        assert torch.equal(res_in, base)


def test_rope_in_place_matches_rotate_half():
    from stator.engines.native.kernels.elementwise import rope_
    from stator.engines.native.layers import RotaryEmbedding

    rot = RotaryEmbedding(128, 4096, 500000.0, None).to(DEV)
    qkv = torch.randn(29, (32 + 8 + 8) * 128, device=DEV).bfloat16()
    q = qkv[:, : 32 * 128].view(29, 32, 128)
    k = qkv[:, 32 * 128 : 40 * 128].view(29, 8, 128)
    pos = torch.randint(0, 4096, (29,), device=DEV)

    def ref(x):
        cos, sin = rot.cos[pos][:, None], rot.sin[pos][:, None]
        xf = x.float()
        half = torch.cat([-xf[..., 64:], xf[..., :64]], -1)
        return xf * cos + half * sin

    q_ref, k_ref = ref(q), ref(k)
    v_before = qkv[:, 40 * 128 :].clone()
    rope_(q, k, rot.cos, rot.sin, pos)
    assert _rel_err(q, q_ref) < 1e-2 and _rel_err(k, k_ref) < 1e-2
    assert torch.equal(qkv[:, 40 * 128 :], v_before)  # v untouched


def test_silu_mul_matches_torch():
    from stator.engines.native.kernels.elementwise import silu_mul

    x = torch.randn(13, 2 * 14336 + 6, device=DEV).bfloat16()
    n = x.shape[1] // 2
    ref = torch.nn.functional.silu(x[:, :n].float()) * x[:, n:].float()
    assert _rel_err(silu_mul(x), ref) < 1e-2


@pytest.mark.parametrize("rows", [1, 3, 8])
@pytest.mark.parametrize(
    "shape", [(64, 128, 1, 4), (64, 128, 4, 4), (16, 256, 1, 8), (32, 128, 3, 8)]
)
@pytest.mark.parametrize("with_bias", [False, True])
def test_gemv_matches_linear(rows, shape, with_bias):
    from stator.engines.native.kernels.gemv import GemvConfig, gemv

    weight = torch.randn(1000 + 7, 4096 + 64, device=DEV).bfloat16() * 0.02
    bias = torch.randn(weight.shape[0], device=DEV).bfloat16() if with_bias else None
    x = torch.randn(rows, weight.shape[1], device=DEV).bfloat16()
    ref = torch.nn.functional.linear(
        x.float(), weight.float(), None if bias is None else bias.float()
    )
    out = gemv(x, weight, GemvConfig(*shape), bias)
    assert out.shape == (rows, weight.shape[0])
    assert _rel_err(out, ref) < 1e-2


def test_gemv_choice_is_correct_or_none():
    from stator.engines.native.kernels.gemv import choose, gemv

    weight = torch.randn(6144, 4096, device=DEV).bfloat16() * 0.02
    cfg = choose(weight)
    if cfg is not None:
        x = torch.randn(2, 4096, device=DEV).bfloat16()
        ref = torch.nn.functional.linear(x.float(), weight.float())
        assert _rel_err(gemv(x, weight, cfg), ref) < 1e-2


@pytest.mark.parametrize("splits", [1, 3])
@pytest.mark.parametrize("with_bias", [False, True])
def test_fused_epilogues_equal_the_unfused_kernels(splits, with_bias):
    """Each GEMV consumer with the split-K sum inside (kernels/epilogues.py) writes exactly
    what the sum kernel followed by the unfused kernel writes: bf16, 8B shapes, 3 rows."""
    from stator.engines.native.kernels import epilogues
    from stator.engines.native.kernels.elementwise import rms_norm, rope_, silu_mul
    from stator.engines.native.kernels.gemv import GemvConfig, gemv
    from stator.engines.native.kernels.store_kv import store_kv
    from stator.engines.native.layers import RotaryEmbedding

    gen = torch.Generator(device=DEV).manual_seed(splits)
    rows, hq, hkv, d = 3, 32, 8, 128
    cfg = GemvConfig(32, 128, splits)
    x = torch.randn(rows, 4096, device=DEV, generator=gen).bfloat16()

    def weight(n: int) -> tuple[torch.Tensor, torch.Tensor | None]:
        w = (torch.randn(n, 4096, device=DEV, generator=gen) * 0.02).bfloat16()
        b = torch.randn(n, device=DEV, generator=gen).bfloat16() if with_bias else None
        return w, b

    def parts(w, b):
        if splits == 1:
            return gemv(x, w, cfg, b), None
        return gemv(x, w, cfg, reduce=False), b

    # q/k/v -> RoPE + KV store
    w, b = weight((hq + 2 * hkv) * d)
    rot = RotaryEmbedding(d, 4096, 500000.0, None).to(DEV)
    pos = torch.tensor([7, 4000, 1], device=DEV)
    slots = torch.tensor([5, -1, 2], device=DEV)
    caches = [torch.zeros(4, 2, hkv, d, device=DEV).bfloat16() for _ in range(4)]
    ref = gemv(x, w, cfg, b)
    q, k, v = ref.split([hq * d, hkv * d, hkv * d], -1)
    q, k, v = q.view(rows, hq, d), k.view(rows, hkv, d), v.view(rows, hkv, d)
    rope_(q, k, rot.cos, rot.sin, pos)
    store_kv(k, v, caches[0], caches[1], slots)
    p, pb = parts(w, b)
    out = epilogues.qkv_rope_store(
        p, splits, pb, hq, hkv, rot.cos, rot.sin, pos, slots, caches[2], caches[3], x.dtype
    )
    assert torch.equal(out, ref)
    assert torch.equal(caches[2], caches[0]) and torch.equal(caches[3], caches[1])
    # o -> residual add + RMSNorm
    w, b = weight(4096)
    norm_w = (torch.rand(4096, device=DEV, generator=gen) + 0.5).bfloat16()
    res = torch.randn(rows, 4096, device=DEV, generator=gen).bfloat16()
    res_ref = res.clone()
    ref = rms_norm(gemv(x, w, cfg, b), norm_w, 1e-5, res_ref)
    p, pb = parts(w, b)
    assert torch.equal(epilogues.add_rms_norm(p, splits, pb, res, norm_w, 1e-5), ref)
    assert torch.equal(res, res_ref)
    # gate/up -> SiLU-and-multiply (no bias in any gated MLP)
    w, _ = weight(2 * 1536)
    p, _ = parts(w, None)
    ref = silu_mul(gemv(x, w, cfg))
    assert torch.equal(epilogues.silu_mul(p, splits, x.dtype), ref)
    # ... or inside the GEMV: its own epilogue (one split), or its partials (several)
    gated = gemv(x, w, cfg, gated=True, reduce=splits == 1)
    if splits > 1:
        gated = epilogues.silu_mul(gated, splits, x.dtype)
    assert torch.equal(gated, ref)


@pytest.mark.parametrize("epilogue", ["parts", "gated"])
def test_gemv_choice_for_an_epilogue_is_correct_or_none(epilogue):
    from stator.engines.native.kernels import epilogues
    from stator.engines.native.kernels.elementwise import silu_mul
    from stator.engines.native.kernels.gemv import choose, gemv

    weight = torch.randn(2 * 3584, 4096, device=DEV).bfloat16() * 0.02
    cfg = choose(weight, None, epilogue)
    if cfg is None:
        return
    x = torch.randn(2, 4096, device=DEV).bfloat16()
    ref = torch.nn.functional.linear(x.float(), weight.float())
    gated = epilogue == "gated"
    out = gemv(x, weight, cfg, gated=gated, reduce=cfg.split_k == 1)
    if gated:
        ref = silu_mul(ref.bfloat16()).float()
    if cfg.split_k > 1:
        out = epilogues.silu_mul(out, cfg.split_k, x.dtype) if gated else out.sum(0)
    assert _rel_err(out, ref) < 1e-2


def test_fused_epilogues_and_pdl_leave_the_engine_s_tokens_unchanged(llama):
    """bf16 on CUDA with decode graphs, a split-K GEMV forced on every projection: greedy
    tokens of a mixed batch are the same with the fused epilogues and programmatic
    dependent launch (kernels/pdl.py) each on and off."""
    from stator.engines.native import epilogues, step_graphs
    from stator.engines.native.config import NativeConfig
    from stator.engines.native.engine_core import EngineCore
    from stator.engines.native.kernels import pdl
    from stator.engines.native.kernels.gemv import GemvConfig
    from stator.engines.native.layers import Linear
    from tests.engines.native.models import greedy_request, prompt, run_all, tokens_of

    model_dir, _ = llama
    core = EngineCore(
        NativeConfig(device="cuda", dtype="bfloat16", kv_cache_memory="8MiB"), model_dir
    )
    for module in core.runner.model.modules():
        if isinstance(module, Linear):
            module.gemv_config = module.epilogue_gemv = GemvConfig(16, 32, 2)
    results, before = [], (epilogues.ENABLED, pdl.ENABLED)
    try:
        for fused, with_pdl in ((False, False), (True, False), (True, True), (False, True)):
            epilogues.ENABLED, pdl.ENABLED = fused, with_pdl
            step_graphs.release(core.runner)
            step_graphs.capture(core.runner, prepare=False)
            tag = f"{fused:d}{with_pdl:d}"
            reqs = [greedy_request(f"r{tag}{i}", prompt(i, 3 + 17 * i), 24) for i in range(5)]
            out = run_all(core, reqs)
            results.append([tokens_of(out[r.request_id]) for r in reqs])
    finally:
        epilogues.ENABLED, pdl.ENABLED = before
    assert all(r == results[0] for r in results)
