"""GPT-OSS's batch-1 decode kernels (routing from the router GEMV's split-K partial sums;
the streaming MoE kernels' variants) run by Triton's interpreter on the CPU in float32,
against the unfused kernels and the PyTorch reference."""

from __future__ import annotations

from tests.engines.native.triton_interpreter import NUMPY2_INDEX_PATCH, run_interpreted

_ROUTE_CHECK = (
    NUMPY2_INDEX_PATCH
    + r"""
import torch
from stator.engines.native.kernels.gemv import GemvConfig, gemv
from stator.engines.native.kernels.moe_route import route

g = torch.Generator().manual_seed(0)
for experts, top_k, splits in ((7, 3, 3), (32, 4, 2), (6, 4, 1)):
    x = torch.randn(2, 96, generator=g)
    w = torch.randn(experts, 96, generator=g)
    b = torch.randn(experts, generator=g)
    cfg = GemvConfig(16, 32, splits)
    logits = gemv(x, w, cfg, b)  # the GEMV summing its own partials (+ bias)
    want = route(logits, top_k, x)
    if splits > 1:
        parts = gemv(x, w, cfg, reduce=False)
        got = route(parts, top_k, x, splits, b)
    else:
        got = route(logits, top_k, x, 1, None)
    for a, c in zip(got, want):
        assert torch.equal(a, c), (experts, top_k, splits)
    ref_w, ref_i = torch.topk(x @ w.T + b, top_k, dim=-1)
    assert torch.equal(got[1], ref_i), (experts, top_k, splits)
    assert torch.allclose(got[0], torch.softmax(ref_w, -1), atol=1e-5)
try:  # partial sums without their bias: refused (the rounding dtype comes from it)
    route(torch.zeros(2, 1, 7), 3, None, 2, None)
except ValueError:
    pass
else:
    raise AssertionError("partial sums without a bias were accepted")
print("ok")
"""
)


def test_routing_sums_the_router_gemv_partials_in_the_interpreter():
    run_interpreted(_ROUTE_CHECK, timeout=300)
