"""Where does one batch-1 decode step go? Per-kernel GPU times of the batch-1 decode graph
(torch.profiler over its replays) and each Llama-3.1-8B weight shape's matmul at one row
timed alone (cuBLAS on W [N, K], cuBLAS on a pre-transposed W.T [K, N], the split-K Triton
GEMV), against the weight bytes over the measured copy bandwidth.

    python benchmarks/native_gpu_profile.py [--json out.json]
"""

from __future__ import annotations

import argparse
import itertools
import json
import random
import re
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from native_gpu import LLAMA_31_8B, copy_bandwidth, start_decoding

from stator.engines.native.config import NativeConfig
from stator.engines.native.engine_core import EngineCore
from stator.engines.native.kernels.gemv import choose, gemv

SHAPES = {  # name -> (N, K) of W; x is [1, K]
    "qkv": (6144, 4096),
    "o": (4096, 4096),
    "gate_up": (28672, 4096),
    "down": (4096, 14336),
    "lm_head": (128256, 4096),
}


def event_ms(fn, reps: int = 200) -> float:
    for _ in range(5):
        fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / reps


def graph_ms(fn, reps: int = 100) -> float:
    """Time `fn` captured in a CUDA graph (no launch gaps), rotating nothing: the weights
    are far larger than L2, so repeated reads still come from HBM."""
    fn()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(10):
            fn()
    return event_ms(g.replay, reps) / 10


def measure_shape(n: int, k: int, bw: float) -> dict:
    # Two weight copies in rotation: each read comes from HBM, not L2.
    ws = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.02 for _ in range(2)]
    wts = [w.t().contiguous() for w in ws]
    x = torch.randn(1, k, device="cuda", dtype=torch.bfloat16)
    x2 = torch.randn(2, k, device="cuda", dtype=torch.bfloat16)
    row: dict = {"floor_ms": 1e3 * n * k * 2 / bw}
    row["cublas_ms"] = graph_ms(lambda: [F.linear(x, w) for w in ws]) / 2
    row["cublas_t_ms"] = graph_ms(lambda: [x @ wt for wt in wts]) / 2
    row["cublas_b2_ms"] = graph_ms(lambda: [F.linear(x2, w) for w in ws]) / 2
    cfg = choose(ws[0])
    row["gemv_cfg"] = str(cfg)
    if cfg is not None:
        row["gemv_ms"] = graph_ms(lambda: [gemv(x, w, cfg) for w in ws]) / 2
    return row


def matmul_table(bw: float) -> dict:
    out = {name: measure_shape(n, k, bw) for name, (n, k) in SHAPES.items()}
    torch.cuda.empty_cache()
    return out


def short_name(kernel: str) -> str:
    kernel = re.sub(r"<.*", "", kernel)
    return kernel[:70]


def profile_graph(core: EngineCore, bs: int, reps: int = 20) -> dict:
    graph = core.runner.graphs.graphs[bs, False]
    for _ in range(5):
        graph.replay()
    torch.cuda.synchronize()
    replay_ms = event_ms(graph.replay, 50)
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            graph.replay()
        torch.cuda.synchronize()
    per_kernel: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
    events = sorted(
        (e for e in prof.events() if e.device_type.name == "CUDA"), key=lambda e: e.time_range.start
    )
    busy = 0.0
    for e in events:
        entry = per_kernel[short_name(e.name)]
        entry[0] += 1
        entry[1] += e.time_range.elapsed_us()
        busy += e.time_range.elapsed_us()
    span = events[-1].time_range.end - events[0].time_range.start if events else 0
    kernels = {
        k: {"per_step": c / reps, "us_per_step": t / reps}
        for k, (c, t) in sorted(per_kernel.items(), key=lambda kv: -kv[1][1])
    }
    return {
        "replay_ms": replay_ms,
        "kernel_busy_ms_per_step": busy / reps / 1e3,
        "span_ms_per_step": span / reps / 1e3,
        "launches_per_step": len(events) / reps,
        "kernels": kernels,
    }


def profile_steps(core: EngineCore, reps: int = 12) -> dict:
    """Whole engine steps (the overlapped loop): how much of the wall time the GPU is busy,
    and what runs outside the decode graph."""
    from torch.profiler import ProfilerActivity, profile

    for _ in range(3):
        core.step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        start = time.perf_counter()
        for _ in range(reps):
            core.step()
        torch.cuda.synchronize()
        wall = time.perf_counter() - start
    events = sorted(
        (e for e in prof.events() if e.device_type.name == "CUDA"), key=lambda e: e.time_range.start
    )
    busy = sum(e.time_range.elapsed_us() for e in events)
    gaps = [
        b.time_range.start - a.time_range.end
        for a, b in itertools.pairwise(events)
        if b.time_range.start > a.time_range.end
    ]
    return {
        "wall_ms_per_step": 1e3 * wall / reps,
        "gpu_busy_ms_per_step": busy / reps / 1e3,
        "largest_gaps_us": sorted(gaps, reverse=True)[:8],
        "gaps_over_20us_per_step": sum(g for g in gaps if g > 20) / reps,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", type=Path)
    ap.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 64, 256])
    ap.add_argument("--skip-matmuls", action="store_true")
    args = ap.parse_args()
    bw = copy_bandwidth()
    res: dict = {"device": torch.cuda.get_device_name(), "copy_bandwidth": bw}
    res["matmul"] = {} if args.skip_matmuls else matmul_table(bw)
    print(json.dumps(res["matmul"], indent=1), flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = Path(tmp)
        (model_dir / "config.json").write_text(json.dumps(LLAMA_31_8B))
        config = NativeConfig(
            device="cuda",
            dtype="bfloat16",
            load_format="dummy",
            max_model_len=4096,
            max_num_seqs=max(args.batch_sizes),
            gpu_memory_utilization=0.5,
        )
        core = EngineCore(config, model_dir)
        rng = random.Random(0)
        res["graphs"] = {}
        for bs in args.batch_sizes:
            start_decoding(core, rng, f"p{bs}", bs, prompt_len=256, max_tokens=40, warm_steps=4)
            res["graphs"][bs] = profile_graph(core, bs)
            res["graphs"][bs]["steps"] = profile_steps(core)
            while core.has_work():
                core.step()
    if args.json:
        args.json.write_text(json.dumps(res, indent=1))
    for bs, g in res["graphs"].items():
        print(
            f"\n## batch {bs}: replay {g['replay_ms']:.3f} ms, kernels busy "
            f"{g['kernel_busy_ms_per_step']:.3f} ms, span {g['span_ms_per_step']:.3f} ms, "
            f"{g['launches_per_step']:.0f} launches"
        )
        for name, k in list(g["kernels"].items())[:16]:
            print(f"{k['us_per_step']:9.1f} us  x{k['per_step']:5.0f}  {name}")
        print("engine steps:", json.dumps(g["steps"]))
    print(f"\ncopy bandwidth {bw / 1e12:.2f} TB/s")
    print("| shape | floor ms | cuBLAS W | cuBLAS W.T | cuBLAS 2 rows | gemv | gemv cfg |")
    print("|---|---|---|---|---|---|---|")
    for name, r in res["matmul"].items():
        print(
            f"| {name} | {r['floor_ms']:.4f} | {r['cublas_ms']:.4f} | {r['cublas_t_ms']:.4f} "
            f"| {r['cublas_b2_ms']:.4f} | {r.get('gemv_ms', 0):.4f} | {r['gemv_cfg']} |"
        )


if __name__ == "__main__":
    main()
