"""KV offload on one GPU: copy bandwidths, and multi-turn TTFT through HTTP with the host tier
against without it.

    python benchmarks/kv_offload_gpu.py [--out DIR] [--sessions 16] [--prefix 6000]

1. Bandwidths, 8B-shaped blocks (32 layers x 2 x 16 tokens x 8 KV heads x 128, bf16: 2 MiB):
   plain host->device and device->host copies of 1 GiB of pinned memory, then `BlockMover`
   loading n blocks from pinned host slots into random blocks of an 8 GiB pool (one copy per
   run of slots + one scatter; what the engine does) and saving them back, and the slow way
   for contrast (one copy per block, layer and K/V). The goal: copy-back >= 70% of plain H2D.
2. Serving: `stator run` with a random-weight Llama-3.1-8B-shaped model, a 3 GiB KV cache
   (24k tokens) and `--max-num-seqs 8`; S sessions of P-token distinct prefixes, 3 turns
   each, round-robin (so the working set is S*P tokens, ~4x the cache and every session's
   prefix has left the GPU by its next turn); each turn adds 200 user tokens and asks for 16.
   Sequential requests, TTFT from the streamed response. Once with `--kv-offloading-size 16`,
   once without.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import statistics
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from native_gpu_serve import make_8b_dir  # noqa: E402
from stator_http import launch  # noqa: E402

from stator.kv.block_copy import BlockMover, block_shape, pool_shape  # noqa: E402

GiB = 1 << 30


def _time_copy(fn, reps: int = 5) -> float:
    """Median seconds of `fn` on the current stream, by CUDA events."""
    times = []
    for _ in range(reps + 1):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return statistics.median(times[1:])


def _plain_bandwidth() -> dict:
    src = torch.empty(GiB, dtype=torch.uint8, pin_memory=True)
    dst = torch.empty(GiB, dtype=torch.uint8, device="cuda")
    return {
        "h2d_gbs": GiB / _time_copy(lambda: dst.copy_(src, non_blocking=True)) / 1e9,
        "d2h_gbs": GiB / _time_copy(lambda: src.copy_(dst, non_blocking=True)) / 1e9,
    }


def bandwidths() -> dict:
    out = _plain_bandwidth()
    pool = torch.zeros(pool_shape(32, 4096, 16, 8, 128), dtype=torch.bfloat16, device="cuda")
    host = torch.zeros((1024, *block_shape(pool)), dtype=torch.bfloat16, pin_memory=True)
    per_block = host[0].numel() * host.element_size()
    mover = BlockMover(pool)
    rng = random.Random(0)
    rows = []
    for n in (32, 128, 512, 1024):
        ids = rng.sample(range(4096), n)
        for layout in ("contiguous", "fragmented"):
            slots = list(range(n)) if layout == "contiguous" else _fragmented(rng, n, 1024)
            loads, saves = [], []
            for _ in range(4):
                start = torch.cuda.Event(enable_timing=True)
                done = mover.load(host, slots, ids, start=start)
                done.synchronize()
                loads.append(start.elapsed_time(done) / 1e3)
                begin = torch.cuda.Event(enable_timing=True)
                begin.record()
                saved = mover.save(ids, host, slots)
                saved.synchronize()
                saves.append(begin.elapsed_time(saved) / 1e3)
            load_s, save_s = statistics.median(loads[1:]), statistics.median(saves[1:])
            rows.append(
                {
                    "blocks": n,
                    "slots": layout,
                    "load_gbs": n * per_block / load_s / 1e9,
                    "save_gbs": n * per_block / save_s / 1e9,
                }
            )
    out["mover"] = rows
    # The slow way: one small copy per block, layer and K/V.
    n = 128
    ids = rng.sample(range(4096), n)

    def per_slice() -> None:
        for i, b in enumerate(ids):
            for layer in range(32):
                for kv in (0, 1):
                    pool[layer, kv, b].copy_(host[i, layer, kv], non_blocking=True)

    out["per_slice_load_gbs"] = n * per_block / _time_copy(per_slice, reps=2) / 1e9
    best = max(r["load_gbs"] for r in rows if r["blocks"] >= 512)
    out["copy_back_vs_h2d"] = best / out["h2d_gbs"]
    return out


def _fragmented(rng: random.Random, n: int, slots: int) -> list[int]:
    """n slots in runs of 1-16, as a host tier that has been evicting for a while hands out."""
    free = list(range(slots))
    out: list[int] = []
    while len(out) < n:
        run = min(rng.randint(1, 16), n - len(out))
        start = rng.randrange(0, len(free) - run + 1)
        out.extend(free[start : start + run])
        del free[start : start + run]
    return sorted(out)


def ttft(url: str, model: str, ids: list[int], max_tokens: int) -> float:
    body = json.dumps(
        {
            "model": model,
            "prompt": ids,
            "max_tokens": max_tokens,
            "temperature": 0,
            "stream": True,
        }
    ).encode()
    req = urllib.request.Request(
        f"{url}/v1/completions", body, {"Content-Type": "application/json"}
    )
    began = time.perf_counter()
    first = None
    with urllib.request.urlopen(req, timeout=300) as resp:
        for line in resp:
            if first is None and line.startswith(b"data:") and b"[DONE]" not in line:
                first = time.perf_counter() - began
    assert first is not None
    return first


def serve(model_dir: Path, root: Path, tiers: bool, args: argparse.Namespace) -> dict:
    flags = [
        "--device", args.device, "--model", str(model_dir), "--load-format", "dummy",
        "--kv-cache-memory", args.kv_cache, "--max-num-seqs", "8", "--max-model-len", str(args.max_model_len),
    ]  # fmt: skip
    if args.device == "cuda":
        flags += ["--dtype", "bfloat16"]
    if tiers:
        flags += ["--kv-offloading-size", str(args.host_gb)]
    name = "tiers" if tiers else "gpu_only"
    log = root / f"{name}.log"
    proc, url = launch(flags, log, timeout=600)
    try:
        with urllib.request.urlopen(f"{url}/v1/models") as resp:
            model = json.loads(resp.read())["data"][0]["id"]
        rng = random.Random(1)
        sessions = [
            [rng.randrange(10, 4000) for _ in range(args.prefix)] for _ in range(args.sessions)
        ]
        first, later = [], []
        for turn in range(3):
            for s in sessions:
                s.extend(rng.randrange(10, 4000) for _ in range(200))
                (first if turn == 0 else later).append(ttft(url, model, s, 16))
                s.extend(rng.randrange(10, 4000) for _ in range(16))  # the "answer"
    finally:
        proc.terminate()
        proc.wait(120)
    text = log.read_text(errors="replace")
    if args.out:
        (Path(args.out) / f"kv_offload_{name}.log").write_text(text[-20000:])
    m = re.search(r"KV tiers: .*", text)
    return {
        "first_turn_ttft_p50_ms": statistics.median(first) * 1e3,
        "later_ttft_p50_ms": statistics.median(later) * 1e3,
        "later_ttft_p90_ms": statistics.quantiles(later, n=10)[-1] * 1e3,
        "later_ttft_ms": [round(x * 1e3, 1) for x in later],
        "engine_summary": m.group(0) if m else None,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", default=os.environ.get("OUT", ""))
    parser.add_argument("--sessions", type=int, default=16)
    parser.add_argument("--prefix", type=int, default=6000)
    parser.add_argument("--host-gb", type=float, default=16)
    parser.add_argument("--kv-cache", default="3GiB", help="the GPU tier's size")
    parser.add_argument("--max-model-len", type=int, default=8192)
    parser.add_argument("--skip-serve", action="store_true")
    parser.add_argument("--skip-bandwidth", action="store_true")
    parser.add_argument("--device", default="cuda", help="cpu: a smoke test of the script")
    parser.add_argument("--model", default="", help="a model dir instead of the 8B shape")
    args = parser.parse_args()
    result: dict = {"device": torch.cuda.get_device_name() if args.device == "cuda" else "cpu"}
    if not args.skip_bandwidth:
        result["bandwidth"] = bandwidths()
        print(json.dumps(result, indent=1), flush=True)
        if args.out:
            Path(args.out, "kv_offload_gpu.json").write_text(json.dumps(result, indent=1))
        torch.cuda.empty_cache()
    if not args.skip_serve:
        with tempfile.TemporaryDirectory() as tmp:
            root = Path(tmp)
            model_dir = Path(args.model) if args.model else make_8b_dir(root)
            result["tiers"] = serve(model_dir, root, True, args)
            print(json.dumps(result["tiers"], indent=1), flush=True)
            if args.out:  # kept if the run without tiers does not finish
                Path(args.out, "kv_offload_gpu.json").write_text(json.dumps(result, indent=1))
            result["gpu_only"] = serve(model_dir, root, False, args)
            t, g = result["tiers"], result["gpu_only"]
            result["later_ttft_p50_ratio"] = t["later_ttft_p50_ms"] / g["later_ttft_p50_ms"]
            result["later_ttft_p90_ratio"] = t["later_ttft_p90_ms"] / g["later_ttft_p90_ms"]
    text = json.dumps(result, indent=1)
    print(text)
    if args.out:
        Path(args.out, "kv_offload_gpu.json").write_text(text)


if __name__ == "__main__":
    main()
