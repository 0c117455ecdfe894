"""The LoRA kernels alone, as a decode step runs them: every projection of a
Llama-3.1-8B-shaped model (32 layers x q/k/v, o, gate/up, down) gets its LoRA (the fused
kernel, one launch a projection, or shrink and expand, two), captured in one CUDA graph
with the scratch memsets, replayed; per step and per launch in microseconds, and the
adapter weight bytes read per step.

    python benchmarks/lora_kernels_gpu.py [--batch 1 64] [--adapters 8] [--rank 16]

`--shrink-programs` times the shrink's K-split target (`kernels/lora.py`) at several
values, for tuning; the first value listed is the one the table's other columns use.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from stator.engines.native.kernels import lora as kernels
from stator.engines.native.lora.batch import build_lora_batch

HIDDEN, INTER, KV = 4096, 14336, 1024
# (in features, shard bounds of the output) per projection of one layer.
PROJECTIONS = [
    (HIDDEN, [(0, HIDDEN), (HIDDEN, HIDDEN + KV), (HIDDEN + KV, HIDDEN + 2 * KV)]),
    (HIDDEN, [(0, HIDDEN)]),
    (HIDDEN, [(0, INTER), (INTER, 2 * INTER)]),
    (INTER, [(0, HIDDEN)]),
]


def step_graph(batch_size: int, adapters: int, rank: int, layers: int, fused: bool):
    dev = torch.device("cuda")
    slots = [i % adapters for i in range(batch_size)]
    batch = build_lora_batch(
        slots, adapters, dev, groups=False, scratch_shape=(layers * 4, 3 * rank)
    )
    ops = []
    weight_bytes = 0
    for layer in range(layers):
        for p, (k, bounds) in enumerate(PROJECTIONS):
            n = bounds[-1][1]
            a = torch.randn(adapters, len(bounds) * rank, k, device=dev, dtype=torch.bfloat16)
            b = torch.randn(adapters, n, rank, device=dev, dtype=torch.bfloat16)
            x = torch.randn(batch_size, k, device=dev, dtype=torch.bfloat16)
            y = torch.zeros(batch_size, n, device=dev, dtype=torch.bfloat16)
            ops.append((layer * 4 + p, x, a, b, y, bounds))
            used = min(adapters, batch_size)
            weight_bytes += used * (a[0].numel() + b[0].numel()) * 2

    def run() -> None:
        batch.clear_scratch()
        for index, x, a, b, y, bounds in ops:
            if fused:
                kernels.lora_fused(x, a, b, y, batch, bounds, rank, index)
            else:
                h = kernels.lora_shrink(x, a, batch, index)
                kernels.lora_expand(h, b, y, batch, bounds, rank)

    run()  # compile; makes the scratch
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        run()
    return graph, weight_bytes, len(ops) * (1 if fused else 2) + 2


def time_graph(graph, reps: int = 50) -> float:
    for _ in range(5):
        graph.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1000 / reps  # microseconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 64])
    parser.add_argument("--adapters", type=int, default=8)
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--layers", type=int, default=32)
    parser.add_argument("--shrink-programs", type=int, nargs="+", default=[1024, 256, 4096])
    parser.add_argument("--variants", nargs="+", default=["fused", "separate"])
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    rows = []
    for bs, programs, variant in itertools.product(args.batch, args.shrink_programs, args.variants):
        kernels._SHRINK_PROGRAMS = programs
        fused = variant == "fused"
        graph, weight_bytes, launches = step_graph(bs, args.adapters, args.rank, args.layers, fused)
        us = time_graph(graph)
        rows.append(
            {
                "batch": bs,
                "variant": variant,
                "shrink_programs": programs,
                "step_us": round(us, 1),
                "us_per_launch": round(us / launches, 2),
                "adapter_mb": round(weight_bytes / 1e6, 1),
                "gb_per_s": round(weight_bytes / us / 1e3, 1),
            }
        )
        print(json.dumps(rows[-1]), flush=True)
        del graph
    if args.json:
        args.json.write_text(json.dumps({"device": torch.cuda.get_device_name(), "rows": rows}))


if __name__ == "__main__":
    main()
