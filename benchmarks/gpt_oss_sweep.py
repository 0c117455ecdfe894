"""GPT-OSS-20B's MoE layer (router included, one layer as a CUDA graph, MXFP4 experts, random
weights in the real shapes) under the kernel settings that the committed tables choose
among, the up and the down kernel swept apart (each with the other at its default):

- batch 1, the token-major streaming kernels (kernels/moe_gemv.py, fp16 pairs);
- 2 to 16 tokens: token-major streaming kernels against the grouped GEMMs (where
  fused_moe.GEMV_MAX_PAIRS should lie);
- 256 tokens: the grouped GEMMs' `tl.dot_scaled` tiles, up and down apart.

Every setting is checked against the PyTorch reference first (relative error < 2e-2); a
setting that fails to compile or agree is reported, not timed. Nothing is installed in the
code: the fastest of each is printed (and left set in this process, for the engine part that
may follow). `python benchmarks/gpt_oss_gpu.py --parts sweep [engine]`.
"""

from __future__ import annotations

import torch

B1_UP = [(2, 8, 4), (1, 8, 4), (2, 4, 4), (4, 8, 4), (2, 16, 4), (1, 16, 4), (2, 8, 8)]
B1_DOWN = [(2, 8, 4), (4, 8, 4), (8, 8, 4), (4, 16, 4), (8, 4, 4), (16, 8, 4), (8, 8, 8)]
SMALL_TOKENS = (2, 4, 8, 16)
GEMM_TOKENS = 256
GEMM_UP = [(64, 64, 64, 4, 3), (64, 64, 64, 4, 4), (64, 128, 64, 4, 3), (64, 64, 128, 4, 3),
           (64, 32, 64, 4, 3), (64, 64, 64, 8, 3), (64, 128, 64, 8, 3), (64, 64, 32, 4, 4)]  # fmt: skip
GEMM_DOWN = [(64, 64, 4, 3), (128, 64, 4, 3), (64, 128, 4, 3), (32, 64, 4, 3), (64, 64, 4, 4),
             (128, 64, 8, 3), (64, 64, 8, 3), (128, 128, 8, 3)]  # fmt: skip


def sweep(experts: int = 32) -> dict:
    from benchmarks.gpt_oss_moe_layer import graph_timed
    from stator.engines.native.kernels import fused_moe as fm
    from stator.engines.native.kernels import moe_gemv as mg
    from tests.engines.native.test_gpu_gpt_oss import _moe

    moe = _moe(True, experts=experts)
    xs = {t: torch.randn(t, 2880, device="cuda", dtype=torch.bfloat16) for t in
          (1, *SMALL_TOKENS, GEMM_TOKENS)}  # fmt: skip
    refs = {}
    for t, x in xs.items():
        w, i = moe.route(x)
        refs[t] = (x, w, i, moe._reference(x, w, i).float())

    def timed(tokens: int, n: int) -> float | str:
        x, w, i, ref = refs[tokens]
        try:
            err = float((fm.fused_moe(x, w, i, moe).float() - ref).norm() / ref.norm())
            if not err < 2e-2:
                return f"wrong: relative error {err:.3g}"
            return round(graph_timed(lambda: moe(x), n) * 1e6, 1)
        except Exception as exc:  # a setting that does not compile or fit
            return f"failed: {type(exc).__name__}: {str(exc)[:160]}"

    def best_of(times: dict):
        ok = {k: v for k, v in times.items() if not isinstance(v, str)}
        return min(ok, key=ok.get) if ok else None

    res: dict = {}
    # 1. batch 1, token-major: up tiles with down at the default, then down tiles.
    default = mg.CONFIG["half2"]
    ups = {}
    for cfg in B1_UP:
        mg.CONFIG["half2"], mg.CONFIG["half2_down"] = cfg, default
        ups[cfg] = timed(1, 50)
    up = best_of(ups) or default
    downs = {}
    for cfg in B1_DOWN:
        mg.CONFIG["half2"], mg.CONFIG["half2_down"] = up, cfg
        downs[cfg] = timed(1, 50)
    down = best_of(downs) or default
    mg.CONFIG["half2"], mg.CONFIG["half2_down"] = up, down
    res["b1_token_major_us"] = {"up": _keys(ups), "down": _keys(downs), "best": [up, down],
                                "best_us": timed(1, 100)}  # fmt: skip
    print(res, flush=True)
    # 2. 2-16 tokens: the token-major streaming kernels against the grouped GEMMs.
    small: dict = {}
    saved = fm.GEMV_MAX_PAIRS
    for t in SMALL_TOKENS:
        fm.GEMV_MAX_PAIRS = 1 << 30
        small[f"{t}_token_major"] = timed(t, 20)
        fm.GEMV_MAX_PAIRS = 0
        small[f"{t}_grouped"] = timed(t, 20)
    fm.GEMV_MAX_PAIRS = saved
    res["small_batch_us"] = small
    print(res, flush=True)
    # 3. 256 tokens, tl.dot_scaled: up tiles (down follows the up tile), then down tiles.
    table = fm.SCALED_CONFIGS
    slot = next(i for i, (most, _) in enumerate(table) if most >= 4 * GEMM_TOKENS)
    most, default = table[slot]
    ups = {}
    for cfg in GEMM_UP:
        table[slot] = (most, cfg)
        fm.DOWN_CONFIGS.pop("scaled", None)
        ups[cfg] = timed(GEMM_TOKENS, 10)
    up = best_of(ups) or default
    table[slot] = (most, up)
    downs = {}
    for cfg in GEMM_DOWN:
        fm.DOWN_CONFIGS["scaled"] = [(most, cfg)]
        downs[cfg] = timed(GEMM_TOKENS, 10)
    down = best_of(downs)
    fm.DOWN_CONFIGS["scaled"] = [(most, down)] if down else []
    res["gemm_256_us"] = {"up": _keys(ups), "down": _keys(downs), "best": [up, down],
                          "best_us": timed(GEMM_TOKENS, 20)}  # fmt: skip
    print(res, flush=True)
    return res


def _keys(times: dict) -> dict:
    return {str(k): v for k, v in times.items()}
