"""The split-K decode attention kernel (kernels/decode_attention.py) run by Triton's
interpreter on the CPU in float32, against a plain softmax over the gathered keys: every
tile shape the GPU sweep picks among (16-128 tokens a tile, the next tile's pages loaded a
tile ahead or not), with one split (in one pass or merged) and several, GQA groups of 4
(Llama) and 8 with a window and sinks (GPT-OSS), pages scattered over the cache, a padded
row (length 0)."""

from __future__ import annotations

import pytest

from stator.engines.native.kernels.decode_attention import DecodeTile
from tests.engines.native.triton_interpreter import NUMPY2_INDEX_PATCH, run_interpreted

_CHECK = (
    NUMPY2_INDEX_PATCH
    + r"""
import math
import torch
from stator.engines.native.kernels.decode_attention import DecodeTile, paged_decode_attention

torch.manual_seed(0)
PAGE, HKV = 16, 2
TILES = [{tiles}]


def reference(q, k_cache, v_cache, table, lens, scale, window, sinks):
    out = torch.zeros_like(q)
    group = q.shape[1] // HKV
    for b, n in enumerate(lens):
        if n == 0:
            continue
        blocks = table[b, : math.ceil(n / PAGE)]
        k = k_cache[blocks].flatten(0, 1)[:n].repeat_interleave(group, 1)
        v = v_cache[blocks].flatten(0, 1)[:n].repeat_interleave(group, 1)
        s = torch.einsum("hd,khd->hk", q[b], k) * scale
        if window:
            s[:, : max(0, n - window)] = float("-inf")
        if sinks is not None:
            s = torch.cat([s, sinks[:, None]], 1)
        p = torch.softmax(s, 1)[:, :n]
        out[b] = torch.einsum("hk,khd->hd", p, v)
    return out


lens = [1, 70, 200, 0, 131]
pages = [math.ceil(n / PAGE) for n in lens]
blocks = sum(pages) + 2
order = torch.randperm(blocks).tolist()
table = torch.zeros(len(lens), max(pages) + 1, dtype=torch.long)
used = 0
for b, n in enumerate(pages):
    table[b, :n] = torch.tensor(order[used : used + n], dtype=torch.long)
    used += n
seq_lens = torch.tensor(lens)
for group, dim, window, with_sinks in ((4, 32, 0, False), (8, 16, 48, True)):
    k_cache = torch.randn(blocks, PAGE, HKV, dim)
    v_cache = torch.randn(blocks, PAGE, HKV, dim)
    q = torch.randn(len(lens), HKV * group, dim)
    sinks = torch.randn(HKV * group) if with_sinks else None
    scale = dim**-0.5
    ref = reference(q, k_cache, v_cache, table, lens, scale, window, sinks)
    for tile in TILES:
        # One split writes the output in one pass unless told to merge; four always merge.
        for splits, single in ((1, None), (1, False), (4, None)):
            out = torch.full_like(q, float("nan"))
            paged_decode_attention(
                q, k_cache, v_cache, table, seq_lens, scale, num_splits=splits,
                window=window, sinks=sinks, out=out, tile=tile, single_pass=single,
            )
            err = (out - ref).abs().max().item()
            assert err < 1e-4, (group, tile, splits, single, err)
print("ok")
"""
)


@pytest.mark.parametrize(
    "tiles",
    [
        "DecodeTile(64, 4, 2, False), DecodeTile(64, 4, 2, True)",
        "DecodeTile(16, 2, 3, True), DecodeTile(32, 4, 1, False), DecodeTile(128, 8, 4, True)",
    ],
    ids=["64", "16-32-128"],
)
def test_every_tile_matches_a_plain_softmax_in_the_interpreter(tiles):
    run_interpreted(_CHECK.replace("{tiles}", tiles), timeout=600)


def test_a_tile_parses_from_its_switch_text_and_refuses_bad_ones():
    assert DecodeTile.parse("32,2,3,1") == DecodeTile(32, 2, 3, True)
    assert str(DecodeTile(64, 4, 2, False)) == "64,4,2,0"
    for bad in ("48,4,2,0", "64,3,2,0", "64,4,0,0", "64,4,2,2", "64,4,2", "fast"):
        with pytest.raises(ValueError, match="decode tile"):
            DecodeTile.parse(bad)


def test_a_single_pass_needs_one_split():
    import torch

    from stator.engines.native.kernels.decode_attention import paged_decode_attention

    q = torch.zeros(1, 4, 16)
    cache = torch.zeros(1, 16, 1, 16)
    table = torch.zeros(1, 1, dtype=torch.long)
    with pytest.raises(ValueError, match="one split"):
        paged_decode_attention(
            q, cache, cache, table, torch.ones(1), 1.0, num_splits=2, single_pass=True
        )
