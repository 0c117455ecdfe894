"""GPT-OSS's fused MoE layer alone on one GPU (router included, CUDA graphs; random weights
in the real shapes): the streaming kernels' and grouped GEMMs' tile sweeps, the crossovers
streaming / grouped GEMM and packed / expanded, then the layer by batch. Every config is
checked against the PyTorch reference before it is timed; the best of each stays installed
in this process for the engine runs that follow. Run through
`python benchmarks/gpt_oss_gpu.py --parts moe|gemm`; `timed` and `graph_timed` serve the
other GPT-OSS scripts too.
"""

from __future__ import annotations

import time

import torch


def timed(fn, n: int) -> float:
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(n):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t) / n


# Streaming kernels: (path, (BLOCK_N, groups of 32 per step, warps)) for mxfp4, "half2" the
# fp16-pair dots (moe_half2.py), "mxfp4" the float32 ones; bf16 (BLOCK_N, BLOCK_K, warps).
# Grouped GEMMs: (MXFP4 mode, (tile M, N, K, warps, stages)); "words" and "bits" tiles need
# K >= 128
# (fused_moe.WORD_CONFIGS), the others K dividing 2,880 (fused_moe.CONFIGS).
GEMV_SWEEP = {
    "mxfp4": [
        ("mxfp4", (2, 16, 4)),
        ("half2", (2, 16, 4)),
        ("half2", (4, 16, 4)),
        ("half2", (1, 16, 4)),
        ("half2", (2, 32, 4)),
        ("half2", (2, 8, 4)),
        ("half2", (4, 16, 8)),
    ],
    "bf16": [(8, 256, 4), (4, 256, 4)],
}
GEMM_SWEEP = {
    256: [("scaled", (64, 64, 64, 4, 3)), ("bits", (32, 64, 128, 4, 3)),
          ("bits", (32, 64, 128, 4, 2)), ("bits", (32, 64, 128, 4, 2, 80)),
          ("bits", (32, 64, 128, 4, 2, 72)), ("bits", (64, 64, 128, 4, 2, 128))],
    512: [("bits", (64, 64, 128, 4, 2)), ("bits", (64, 64, 128, 4, 2, 128)),
          ("bits", (32, 64, 128, 4, 2, 80))],
    64: [("bits", (16, 64, 128, 2, 3))],
    2048: [("scaled", (128, 64, 64, 4, 3))],
}  # fmt: skip


# The bit-wise down kernel's own tile (fused_moe.DOWN_CONFIGS: BLOCK_N, BLOCK_K, warps,
# stages[, register cap]; None: the up kernel's), swept at these token counts after the up
# kernel's. A tile's sixth (down: fifth) number caps its registers (more programs an SM).
DOWN_SWEEP = {
    256: [None, (64, 128, 4, 2), (64, 128, 4, 2, 72), (64, 128, 4, 2, 64), (64, 128, 4, 2, 96)],
    512: [None, (64, 128, 4, 2, 96), (64, 128, 4, 2, 72)],
}  # fmt: skip
# The expert sort's program (moe_align.ONE_HOT, WARPS), timed alone at 1,024 pairs.
ALIGN_SWEEP = [(8192, 4), (8192, 2), (4096, 2), (4096, 4), (16384, 4)]


def graph_timed(fn, n: int) -> float:
    """Seconds per call of `fn` replayed as a CUDA graph (no launch overhead, as in the
    engine's decode graphs)."""
    fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return timed(graph.replay, n)


def _sweep(apply, configs, fn, n: int, check=None) -> tuple[dict, tuple]:
    """Time `fn` under each config (`apply(cfg)` installs it; `check()` asserts its output
    is right); keeps the best installed."""
    times: dict = {}
    best = None
    for cfg in configs:
        apply(cfg)
        try:
            if check is not None:
                check()
            t = graph_timed(fn, n)
        except Exception as exc:  # a config that does not compile, fit or agree: skip it
            times[str(cfg)] = f"failed: {type(exc).__name__}: {str(exc)[:200]}"
            print(f"sweep {cfg}: {times[str(cfg)]}", flush=True)
            continue
        times[str(cfg)] = round(t * 1e6, 1)
        print(f"sweep {cfg}: {times[str(cfg)]} us", flush=True)  # partial results, if cut
        if best is None or t < best[0]:
            best = (t, cfg)
    assert best is not None, times
    apply(best[1])
    return times, best


def _sweep_down(fm, pairs: int, fn, check) -> dict:
    """The bit-wise down kernel's tiles at `pairs` (the up kernel's best installed): the
    best stays in fused_moe.DOWN_CONFIGS["bits"] for up to `pairs` pairs."""
    tokens = pairs // 4
    table = fm.DOWN_CONFIGS.setdefault("bits", [])
    others = [(most, tile) for most, tile in table if most != pairs]
    # Fewer pairs (another up tile's slot) keep the up kernel's tile.
    lower = max((most for most, _ in fm.BITS_CONFIGS if most < pairs), default=None)
    if lower is not None and all(most != lower for most, _ in others):
        others.append((lower, None))

    def apply(tile):
        entries = others if tile is None else [*others, (pairs, tile)]
        table[:] = sorted(entries)

    fm.MXFP4_GEMM = "bits"
    times, best = _sweep(apply, DOWN_SWEEP[tokens], fn, 10, check)
    fm.MXFP4_GEMM = None
    return {"times": times, "best": best[1], "table": list(table)}


def _sweep_align() -> dict:
    """moe_align's program sizes at 1,024 pairs over 32 experts (BLOCK_M 32), each checked
    against align_reference; the best stays installed."""
    from stator.engines.native.kernels import moe_align

    ids = torch.randint(0, 32, (1024,), device="cuda")
    want = moe_align.align_reference(ids, 32, 32)

    def apply(cfg):
        moe_align.ONE_HOT, moe_align.WARPS = cfg

    def check():
        got = moe_align.align(ids, 32, 32)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])

    times, best = _sweep(apply, ALIGN_SWEEP, lambda: moe_align.align(ids, 32, 32), 50, check)
    return {"times": times, "best": best[1]}


@torch.inference_mode()
def install_best_modes(best_mode: dict) -> list:
    """fused_moe.MODES from the sweep: each swept size's fastest mode, up to its pairs."""
    sizes = sorted(best_mode)
    modes = [(4 * t, min(best_mode[t], key=best_mode[t].get)) for t in sizes]
    return [*modes[:-1], (1 << 62, modes[-1][1])]


def bench_moe_layer(packed: bool, experts: int, bandwidth: float, gemm_only: bool = False) -> dict:
    """The fused MoE of one layer alone (router included; CUDA graphs): sweeps of the
    streaming kernels' tiles at batch 1, of the grouped GEMMs' MXFP4 modes and tiles at 64
    and 256 tokens, the crossovers streaming/GEMM
    and packed/expanded, then times by batch. Every config is checked against the reference first; the best of each stays
    installed for the engine runs that follow."""
    from stator.engines.native.kernels import fused_moe as fm
    from stator.engines.native.kernels import moe_dequant, moe_gemv
    from tests.engines.native.test_gpu_gpt_oss import _moe

    moe = _moe(packed, experts=experts)
    mode = "mxfp4" if packed else "bf16"
    per_expert = 3 * 2880 * 2880 * (17 / 32 if packed else 2)  # w13 + w2 bytes
    res: dict = {"sweep_us": {}, "best": {}, "by_batch_us": {}, "crossover_us": {}}
    xs = {t: torch.randn(t, 2880, device="cuda", dtype=torch.bfloat16) for t in (1, 64, 256)}

    def checker(x):
        weights, ids = moe.route(x)
        ref = moe._reference(x, weights, ids).float()

        def check():
            err = float((fm.fused_moe(x, weights, ids, moe).float() - ref).norm() / ref.norm())
            assert err < 2e-2, f"relative error {err:.3g}"

        return check

    def gemv_cfg(cfg):
        if packed:
            path, tile = cfg
            moe_gemv.HALF2 = path == "half2"
            moe_gemv.CONFIG[path] = tile
        else:
            moe_gemv.CONFIG[mode] = cfg

    if not gemm_only:
        times, best = _sweep(gemv_cfg, GEMV_SWEEP[mode], lambda: moe(xs[1]), 50, checker(xs[1]))
        res["sweep_us"]["b1"], res["best"]["b1"] = times, best[1]
        res["b1_bandwidth_frac"] = round(4 * per_expert / best[0] / bandwidth, 3)
    saved_min_pairs, moe_dequant.MIN_PAIRS = moe_dequant.MIN_PAIRS, 0
    best_mode: dict = {}
    for tokens, configs in GEMM_SWEEP.items():
        if tokens not in xs:
            xs[tokens] = torch.randn(tokens, 2880, device="cuda", dtype=torch.bfloat16)
        pairs = tokens * 4
        if not packed:
            configs = [("bytes", c) for m, c in configs if m == "scaled"]

        def gemm_cfg(cfg, pairs=pairs):
            fm.MXFP4_GEMM, tile = cfg
            table = fm.config_table(fm.MXFP4_GEMM)
            slot = next(i for i, (most, _) in enumerate(table) if pairs <= most)
            table[slot] = (table[slot][0], tile)

        times, best = _sweep(
            gemm_cfg, configs, lambda t=tokens: moe(xs[t]), 10, checker(xs[tokens])
        )
        res["sweep_us"][tokens], res["best"][tokens] = times, best[1]
        # The floor: every expert some token routes to (expected count, uniform routing)
        # read once at the copy bandwidth.
        touched = experts * (1 - (1 - 4 / experts) ** tokens)
        res.setdefault("floor_us", {})[tokens] = round(touched * per_expert / bandwidth * 1e6, 1)
        for cfg in configs:  # each mode's best tile of this size stays in its table
            mode_times = {str(c): times[str(c)] for c in configs if c[0] == cfg[0]}
            ok = {k: v for k, v in mode_times.items() if not isinstance(v, str)}
            if ok:
                win = next(c for c in configs if str(c) == min(ok, key=ok.get))
                gemm_cfg(win)
                best_mode.setdefault(tokens, {})[cfg[0]] = ok[str(win)]
        if packed and tokens in DOWN_SWEEP and "bits" in best_mode.get(tokens, {}):
            down = _sweep_down(fm, pairs, lambda t=tokens: moe(xs[t]), checker(xs[tokens]))
            res.setdefault("down_sweep_us", {})[tokens] = down
    # Back to choosing the mode by size (fused_moe.mxfp4_mode), each mode's best tiles kept.
    res["best_by_mode_us"] = best_mode
    fm.MXFP4_GEMM = None
    if packed:
        res["align_sweep_us"] = _sweep_align()
    if gemm_only:  # the best mode of each size installed (the engine runs that follow)
        moe_dequant.MIN_PAIRS = saved_min_pairs
        fm.MODES = install_best_modes(best_mode)
        res["installed"] = {"modes": fm.MODES, "scaled": fm.SCALED_CONFIGS,
                            "words": fm.WORD_CONFIGS, "bits": fm.BITS_CONFIGS,
                            "down": fm.DOWN_CONFIGS}  # fmt: skip
        return res
    for tokens in (4, 8):  # streaming kernels against grouped GEMMs
        x = torch.randn(tokens, 2880, device="cuda", dtype=torch.bfloat16)
        row = {}
        for name, most in (("gemv", 1 << 30), ("gemm", 0)):
            saved, fm.GEMV_MAX_PAIRS = fm.GEMV_MAX_PAIRS, most
            row[name] = round(graph_timed(lambda x=x: moe(x), 20) * 1e6, 1)
            fm.GEMV_MAX_PAIRS = saved
        res["crossover_us"][f"{tokens}_gemv_vs_gemm"] = row
    if packed:
        for tokens in (512, 1024, 2048):  # packed GEMMs against expanded experts
            x = torch.randn(tokens, 2880, device="cuda", dtype=torch.bfloat16)
            row = {}
            for name, min_pairs in (("packed", 0), ("expanded", 1)):
                moe_dequant.MIN_PAIRS = min_pairs
                row[name] = round(graph_timed(lambda x=x: moe(x), 5) * 1e6, 1)
            res["crossover_us"][f"{tokens}_packed_vs_expanded"] = row
    moe_dequant.MIN_PAIRS = saved_min_pairs
    for tokens in (1, 2, 4, 8, 16, 64, 256):
        x = torch.randn(tokens, 2880, device="cuda", dtype=torch.bfloat16)
        res["by_batch_us"][tokens] = round(graph_timed(lambda x=x: moe(x), 20) * 1e6, 1)
    res["installed"] = {"gemv": moe_gemv.CONFIG, "half2": moe_gemv.HALF2, "mxfp4_gemm": fm.MXFP4_GEMM,
                        "word_configs": fm.WORD_CONFIGS, "configs": fm.CONFIGS,
                        "scaled_configs": fm.SCALED_CONFIGS,
                        "gemv_max_pairs": fm.GEMV_MAX_PAIRS, "min_pairs": moe_dequant.MIN_PAIRS}  # fmt: skip
    return res
