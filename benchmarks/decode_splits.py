"""The split-K decode attention kernel by batch size and split count on this GPU (issue #17).

The per-step ledger (`step_ledger.py`) found decode steps of 9-128 sequences at ShareGPT-like
lengths reading their KV at a third of the copy rate, and the split count a suspect:
`default_num_splits` aimed at 2 programs per SM (16 since 2026-11-28), so from 17 sequences
up each sequence was one program and the longest set the time. This times `paged_decode_attention` alone, in the
8B shape (32 query heads, 8 KV heads of 128, 16-token pages, bf16), for each batch size with
contexts drawn from the ShareGPT-like profile (a request's prompt plus a uniform share of its
output), at every split count from 1 to 32, replayed from a CUDA graph over `--layers`
distinct caches (as a decode step's layers: the KV does not stay in L2). It prints the KV
read rate of each (TB/s) next to the copy rate the floor charges KV reads at, the best split, and what the rule picks at
2, 4, 8 and 16 programs per SM for the batch's CUDA-graph bucket.

    python benchmarks/decode_splits.py [--batches 4 8 16 24 32 64 128 256] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from serving_workloads import device_rates, sharegpt

HQ, HKV, DIM, PAGE = 32, 8, 128, 16
SPLITS = (1, 2, 4, 8, 16, 32)
PROGRAMS_PER_SM = (2, 4, 8, 16)


def contexts(batch: int, rng: random.Random) -> list[int]:
    """Context lengths of `batch` decoding ShareGPT-like requests, each partway through."""
    pool = sharegpt(1000)
    return [isl + rng.randrange(osl) + 1 for isl, osl in rng.sample(pool, batch)]


def time_batch(batch: int, layers: int, rng: random.Random, max_model_len: int) -> dict:
    import torch

    from stator.engines.native.cuda_graphs import batch_buckets
    from stator.engines.native.kernels.decode_attention import (
        num_splits_for,
        paged_decode_attention,
    )
    from stator.engines.native.kernels.gemv import _graph_time

    lens = contexts(batch, rng)
    pages = [math.ceil(n / PAGE) for n in lens]
    width = max(pages)
    table = torch.zeros(batch, width, dtype=torch.long, device="cuda")  # as the engine's
    first = 0
    for b, n in enumerate(pages):
        table[b, :n] = torch.arange(first, first + n, device="cuda")
        first += n
    shape = (first, PAGE, HKV, DIM)
    caches = [
        (
            torch.randn(shape, device="cuda", dtype=torch.bfloat16),
            torch.randn(shape, device="cuda", dtype=torch.bfloat16),
        )
        for _ in range(layers)
    ]
    q = torch.randn(batch, HQ, DIM, device="cuda", dtype=torch.bfloat16)
    out = torch.empty_like(q)
    seq_lens = torch.tensor(lens, device="cuda")
    kv_bytes = sum(lens) * 2 * HKV * DIM * 2

    def run(splits: int) -> None:
        for k, v in caches:
            paged_decode_attention(q, k, v, table, seq_lens, DIM**-0.5, num_splits=splits, out=out)

    row: dict = {"batch": batch, "mean_ctx": sum(lens) / batch, "max_ctx": max(lens)}
    tbs = {}
    for s in SPLITS:
        ms = _graph_time(lambda s=s: run(s), calls=2, reps=10) / layers
        tbs[s] = kv_bytes / ms / 1e9
        row[f"us_s{s}"] = round(1e3 * ms, 1)
    row["tb_s"] = {s: round(v, 2) for s, v in tbs.items()}
    row["best_split"] = max(tbs, key=tbs.get)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    bucket = next(b for b in batch_buckets(512) if b >= batch)
    row["rule"] = {p: num_splits_for(bucket, HKV, max_model_len, sms, p) for p in PROGRAMS_PER_SM}
    caches.clear()
    torch.cuda.empty_cache()
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batches", type=int, nargs="+", default=[4, 8, 16, 24, 32, 64, 128, 256])
    ap.add_argument("--layers", type=int, default=8, help="distinct caches a replay walks")
    ap.add_argument("--max-model-len", type=int, default=131072, help="what graphs plan for")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=".")
    args = ap.parse_args()
    rng = random.Random(args.seed)
    copy = device_rates("cuda")["copy_bytes_s"] / 1e12  # the rate the floor charges KV reads
    rows = [time_batch(b, args.layers, rng, args.max_model_len) for b in args.batches]
    print(f"KV read rate (TB/s) by split count; the floor charges KV reads at {copy:.2f} TB/s")
    print(
        "| batch | mean / max ctx | "
        + " | ".join(f"s={s}" for s in SPLITS)
        + " | best | rule at "
        + "/".join(map(str, PROGRAMS_PER_SM))
        + " programs per SM |"
    )
    print("|---|---|" + "---|" * len(SPLITS) + "---|---|")
    for r in rows:
        rule = "/".join(str(r["rule"][p]) for p in PROGRAMS_PER_SM)
        print(
            f"| {r['batch']} | {r['mean_ctx']:.0f} / {r['max_ctx']} | "
            + " | ".join(f"{r['tb_s'][s]:.2f}" for s in SPLITS)
            + f" | {r['best_split']} | {rule} |"
        )
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "decode_splits.json").write_text(
        json.dumps({"copy_tb_s": copy, "rows": rows}, indent=1)
    )


if __name__ == "__main__":
    main()
