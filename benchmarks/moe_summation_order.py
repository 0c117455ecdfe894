"""How far two float32 summation orders of the same GPT-OSS MoE layer land apart, on the CPU.

The GPU test `test_bitwise_grouped_gemms_equal_the_word_wise_ones` compares two grouped-GEMM
modes whose dots add in different orders, with scale bytes 100-160 (pre-activations near
1e10). This script asks what summation order alone does there: a PyTorch MoE (20B shapes,
random MXFP4 experts, the test's scale bytes) computed with the up projection summed over K
in one order and in four interleaved quarters, the activations and each pair's output rounded
to bf16 as the kernels do; it prints the relative norm difference of the two outputs and the
rows that moved by more than 1e-2. CPU only (1,500 tokens: ~6 minutes on two cores).

    python benchmarks/moe_summation_order.py --tokens 256 1500 --seeds 0 1
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from stator.engines.native.config import ModelSpec
from stator.engines.native.models.moe import MoE
from tests.engines.native.test_gpt_oss import GPT_OSS_20B


def make_moe(experts: int = 32) -> MoE:
    spec = ModelSpec.from_dicts({**GPT_OSS_20B, "num_local_experts": experts}, {})
    torch.set_default_dtype(torch.bfloat16)
    try:
        moe = MoE(spec, True)
    finally:
        torch.set_default_dtype(torch.float32)
    moe.init_dummy(torch.Generator().manual_seed(0))
    moe.router.weight.data.normal_(0, 0.05)
    g = torch.Generator().manual_seed(5)
    for s in (moe.w13_scales, moe.w2_scales):
        s.copy_(torch.randint(100, 161, s.shape, generator=g, dtype=torch.uint8))
    return moe


@torch.no_grad()
def moe_output(moe: MoE, x, weights, ids, quarters: bool) -> torch.Tensor:
    """The layer's output, bf16-rounded; `quarters`: the up projection's K summed in four
    interleaved quarters, added last (another order than one matmul)."""
    y = torch.zeros(x.shape, dtype=torch.float32)
    for e in torch.unique(ids).tolist():
        rows, slots = torch.where(ids == e)
        w13, w2 = (w.float() for w in moe.expert_weights(e))
        xa = x[rows].float()
        pre = sum(xa[:, q::4] @ w13[:, q::4].T for q in range(4)) if quarters else xa @ w13.T
        h = moe.activation(pre + moe.b13[e].float()).to(torch.bfloat16).float()
        out = (h @ w2.T + moe.b2[e].float()) * weights[rows, slots, None].float()
        y.index_add_(0, rows, out.to(torch.bfloat16).float())
    return y.to(torch.bfloat16).float()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tokens", type=int, nargs="+", default=[256, 1500])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0], help="router weights and x")
    args = ap.parse_args()
    for seed, tokens in ((s, t) for s in args.seeds for t in args.tokens):
        torch.manual_seed(seed)
        moe = make_moe()
        x = torch.randn(tokens, 2880, dtype=torch.bfloat16)
        with torch.no_grad():
            weights, ids = moe.route(x)
        a = moe_output(moe, x, weights, ids, quarters=False)
        b = moe_output(moe, x, weights, ids, quarters=True)
        moved = int(((a - b).norm(dim=1) / a.norm(dim=1) > 1e-2).sum())
        rel = ((a - b).norm() / a.norm()).item()
        print(f"seed {seed}, {tokens} tokens: relative norm difference {rel:.3g}, "
              f"rows moved > 1e-2: {moved}")  # fmt: skip


if __name__ == "__main__":
    main()
