"""Admission order on the CPU: the native engine's real `Scheduler` and `BlockManager`
driven by a model of an H100 step instead of a GPU, FCFS vs longest output first
(`--scheduling-policy lof`), on the length profiles of `serving_workloads.py`.

The step model (8B-shaped Llama, bf16, fitted to `native_gpu_http_vs_engine.py`'s H100
runs of the fourth session): a step streams the weights (5.06 ms at the GEMVs' 2.77
TB/s) or computes its matmuls at 750 TFLOP/s, whichever is longer, plus its KV reads at
3.0 TB/s, 0.8 ms of fixed host and launch time and 7 us a sequence; a mixed step above
the 1,024-token piecewise-graph limit runs eagerly, ~30 ms of host launches at least.
It gives batch-1 5.9 ms (169 tok/s, measured 5.9), 256 decodes at ~620 context 14.6 ms
(14.57), 240 decodes + a 600-token prompt 22.7 ms (21.6). Absolute seconds are a model;
the ratio between two orders on the same model is the number to read.

Modes: `offline` adds every request at once and steps until done (the engine-alone run);
`closed` keeps `--concurrency` requests in the engine, sending the next in list order as
one finishes (what `stator bench` does through HTTP).

    python benchmarks/admission_sim.py [--profiles sharegpt heavy] [--modes offline closed]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from serving_workloads import PROFILES  # noqa: E402

from stator.engines.native.block_manager import BlockManager  # noqa: E402
from stator.engines.native.request import SamplingSpec, Sequence  # noqa: E402
from stator.engines.native.scheduler import POLICIES, Scheduler  # noqa: E402

PARAMS = 6.98e9  # the 8B shape with the 4,096-token vocabulary
KV_BYTES_PER_TOKEN = 131072
ATTN_FLOPS_PER_PAIR = 4 * 32 * 32 * 128


def step_seconds(seqs: list[Sequence], tokens: list[int]) -> float:
    flops = kv = 0.0
    for s, n in zip(seqs, tokens, strict=True):
        ctx = s.num_computed_tokens
        flops += 2 * PARAMS * n + ATTN_FLOPS_PER_PAIR * n * (ctx + n / 2)
        kv += KV_BYTES_PER_TOKEN * ctx
    total = sum(tokens)
    device = max(2 * PARAMS / 2.77e12, flops / 750e12) + kv / 3.0e12
    host = 0.8e-3 + 7e-6 * len(seqs)
    if total > 1024 and total > len(seqs):  # eager mixed step: launch-bound
        host = max(host, 30e-3)
    return device + host


def simulate(
    lengths: list[tuple[int, int]], policy: str, mode: str, concurrency: int, max_seqs: int
) -> dict:
    sched = Scheduler(
        BlockManager(26_000, 16, prefix_caching=False),
        max_num_seqs=max_seqs,
        max_num_batched_tokens=8192,
        num_continuous_decode_steps=4,
        policy=policy,
    )

    def add(i: int) -> None:
        isl, osl = lengths[i]
        sampling = SamplingSpec(max_tokens=osl)
        sched.add(Sequence(str(i), list(range(isl)), isl, sampling, 1 << 20))

    sent = len(lengths) if mode == "offline" else min(concurrency, len(lengths))
    for i in range(sent):
        add(i)
    clock = host = 0.0
    steps = tail_steps = 0
    tail_s = 0.0
    out = 0
    while sched.has_work():
        t = time.perf_counter()
        batch = sched.schedule()
        host += time.perf_counter() - t
        dt = step_seconds(batch.seqs, batch.num_new_tokens)
        clock += dt
        steps += 1
        if not sched.waiting and sent == len(lengths):
            tail_steps += 1
            tail_s += dt
        for s, n in zip(batch.seqs, batch.num_new_tokens, strict=True):
            s.num_computed_tokens += n
            if s.num_computed_tokens < s.num_tokens:
                continue
            s.token_ids.append(1)
            out += 1
            if s.num_output_tokens >= s.sampling.max_tokens:
                sched.remove(s)
                if sent < len(lengths):
                    add(sent)
                    sent += 1
    return {
        "seconds": clock,
        "output_tok_s": out / clock,
        "steps": steps,
        "tail_steps": tail_steps,
        "tail_s": tail_s,
        "scheduler_host_s": host,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--profiles", nargs="+", default=["sharegpt", "heavy"], choices=PROFILES)
    ap.add_argument("--modes", nargs="+", default=["offline", "closed"])
    ap.add_argument("--num-requests", type=int, default=1000)
    ap.add_argument("--seeds", type=int, default=1, help="workload seeds 0 .. N-1")
    ap.add_argument("--concurrency", type=int, default=256)
    ap.add_argument("--max-num-seqs", type=int, default=256)
    args = ap.parse_args()
    print(
        "| profile | seed | mode | policy | model s | tok/s | vs fcfs | steps | tail steps / s "
        "| scheduler host s |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for profile in args.profiles:
        for seed in range(args.seeds):
            lengths = PROFILES[profile](args.num_requests, seed)
            for mode in args.modes:
                base = None
                for policy in POLICIES:
                    r = simulate(lengths, policy, mode, args.concurrency, args.max_num_seqs)
                    base = base or r["output_tok_s"]
                    print(
                        f"| {profile} | {seed} | {mode} | {policy} | {r['seconds']:.1f} | "
                        f"{r['output_tok_s']:.0f} | {r['output_tok_s'] / base:.3f} | "
                        f"{r['steps']} | {r['tail_steps']} / {r['tail_s']:.1f} | "
                        f"{r['scheduler_host_s']:.2f} |",
                        flush=True,
                    )


if __name__ == "__main__":
    main()
