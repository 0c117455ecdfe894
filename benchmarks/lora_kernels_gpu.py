"""The LoRA kernels alone, as a decode step runs them: every projection of a
Llama-3.1-8B-shaped model (32 layers x q/k/v, o, gate/up, down) gets its shrink and
expand, captured in one CUDA graph with the workspace memset, replayed; per step and per
launch in microseconds, and the adapter weight bytes read per step.

    python benchmarks/lora_kernels_gpu.py [--batch 1 64] [--adapters 8] [--rank 16]

`--shrink-programs` times the shrink's K-split target (`kernels/lora.py`) at several
values, for tuning; the first value listed is the one the table's other columns use.
"""

from __future__ import annotations

import argparse
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


def step_graph(batch_size: int, adapters: int, rank: int, layers: int):
    dev = torch.device("cuda")
    slots = [i % adapters for i in range(batch_size)]
    batch = build_lora_batch(slots, adapters, dev, groups=False)
    width = 3 * rank
    batch.workspace = torch.zeros(layers * 4, batch_size, width, device=dev)
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
        batch.workspace.zero_()
        for index, x, a, b, y, bounds in ops:
            h = kernels.lora_shrink(x, a, batch, index)
            kernels.lora_expand(h, b, y, batch, bounds, rank)

    run()  # compile
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        run()
    return graph, weight_bytes, len(ops) * 2 + 1


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
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    rows = []
    for bs in args.batch:
        for programs in args.shrink_programs:
            kernels._SHRINK_PROGRAMS = programs
            graph, weight_bytes, launches = step_graph(bs, args.adapters, args.rank, args.layers)
            us = time_graph(graph)
            rows.append(
                {
                    "batch": bs,
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
