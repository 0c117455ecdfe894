"""Tensor parallelism on the GPUs of one host: the random-weight Llama-3.1-8B-shaped model
of `native_gpu.py` (bf16, `--load-format dummy`) at each `--sizes` value, one engine at a
time. Prints one table; `--json PATH` keeps the numbers.

    python benchmarks/native_gpu_tp.py [--sizes 1 2] [--json out.json]

Per size: batch-1 decode tok/s (32-token prompt, 256 tokens out, the second of two runs),
TTFT of one 1,024-token prompt on an idle engine (median of 5 after one warm-up, distinct
prompts), the decode step time at batch 1 and 32, and the start-up time (rank processes,
weights, warm-up, CUDA-graph capture).
"""

from __future__ import annotations

import argparse
import faulthandler
import gc
import json
import logging
import random
import signal
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.native_gpu import LLAMA_31_8B, decode_and_ttft, drain, random_ids, request
from stator.engines.native.config import NativeConfig
from stator.engines.native.engine_core import EngineCore


def decode_step_ms(core: EngineCore, rng: random.Random, batch: int, steps: int = 24) -> float:
    for i in range(batch):
        core.add_request(request(f"s{batch}-{i}", random_ids(rng, 256), steps + 8))
    while any(s.num_computed_tokens < s.num_prompt_tokens for s in core.seqs.values()):
        core.step()
    for _ in range(3):
        core.step()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(steps):
        core.step()
    ms = 1e3 * (time.perf_counter() - start) / steps
    drain(core)
    return ms


def bench(size: int, args: argparse.Namespace, model_dir: Path) -> dict:
    config = NativeConfig(
        device="cuda",
        dtype="bfloat16",
        load_format="dummy",
        max_model_len=args.max_model_len,
        max_num_seqs=args.max_num_seqs,
        gpu_memory_utilization=args.gpu_memory_utilization,
        tensor_parallel_size=size,
        enforce_eager=args.eager,
    )
    t0 = time.perf_counter()
    core = EngineCore(config, model_dir)
    res: dict = {"size": size, "eager": args.eager, "startup_s": time.perf_counter() - t0}
    res["kv_blocks"] = core.blocks.num_blocks
    rng = random.Random(1)
    try:
        res.update(decode_and_ttft(core, rng))
        res["step_ms"] = {bs: decode_step_ms(core, rng, bs) for bs in args.batch_sizes}
    finally:
        core.close()
        del core
        gc.collect()
        torch.cuda.empty_cache()
    print(json.dumps(res), flush=True)
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--max-model-len", type=int, default=4096)
    ap.add_argument("--max-num-seqs", type=int, default=64)
    ap.add_argument("--gpu-memory-utilization", type=float, default=0.9)
    ap.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 32])
    ap.add_argument("--eager", action="store_true", help="no CUDA graphs")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s rank0 %(name)s %(message)s")
    # `timeout -s USR1 ...` (signals the whole group): every rank prints where it is.
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = Path(tmp)
        (model_dir / "config.json").write_text(json.dumps(LLAMA_31_8B))
        for size in args.sizes:
            results.append(bench(size, args, model_dir))
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    print(f"\ndevice: {torch.cuda.get_device_name()} x {torch.cuda.device_count()}")
    steps = " | ".join(f"step ms, batch {bs}" for bs in args.batch_sizes)
    print(f"| TP | batch-1 decode tok/s | TTFT 1,024 tokens ms | {steps} | start-up s |")
    print("|---|---|---|" + "---|" * len(args.batch_sizes) + "---|")
    for r in results:
        cells = " | ".join(f"{r['step_ms'][bs]:.2f}" for bs in args.batch_sizes)
        print(
            f"| {r['size']} | {r['b1_decode_tok_s']:.1f} | {r['ttft_1024_ms']:.1f} | {cells} "
            f"| {r['startup_s']:.0f} |"
        )


if __name__ == "__main__":
    main()
