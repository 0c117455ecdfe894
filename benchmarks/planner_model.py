"""The planner's model of an aggregated worker (`stator/planner/sizing.py`) against a
simulation of one mocker worker fed the Mooncake mix that `benchmarks/planner.py` replays.

    PYTHONPATH=. python benchmarks/planner_model.py [--profile FILE]

The simulation is a discrete-event loop of a vLLM-style worker with the mocker's timing
(`PolynomialTiming`, × `--slowdown`, ÷ `--time-scale`, as planner.py's workers): Poisson
arrivals of (ISL, OSL) pairs drawn from the trace window, one FCFS queue, chunked prefill
of at most `--max-batched-tokens` per step, every running sequence advancing one token
per step; a step that carries prefill costs prefill + decode time. It prints, per rate, the
simulated p90 and mean gap between tokens, and the model's mean gap (its p90 ITL) at the
profile's curves: the ratio the planner's ITL correction has to learn.
"""

from __future__ import annotations

import argparse
import random
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.planner_experiment import (  # noqa: E402
    add_trace_arguments,
    profile_path,
    trace_requests,
)
from stator.engines.mocker.timing import PolynomialTiming, StepShape  # noqa: E402
from stator.planner import sizing  # noqa: E402
from stator.planner.profile import PerfProfile  # noqa: E402

KV_TOKENS = 16384 * 64  # the mocker's default cache, as planner.py's slow profile


def trace_pairs(args) -> list[tuple[int, int]]:
    return [(r.isl, r.osl) for r in trace_requests(args)]


def simulate(rate: float, pairs, args, seed: int) -> tuple[float, float]:
    """(p90 gap, mean gap) in wall ms over `args.seconds` of Poisson arrivals."""
    poly, scale = PolynomialTiming(), args.slowdown / args.time_scale / 1000
    rng = random.Random(seed)
    arrivals, t = [], 0.0
    while t < args.seconds:
        t += rng.expovariate(rate)
        arrivals.append((t, *rng.choice(pairs)))
    waiting: list[list] = []  # [arrival, prompt tokens left, isl, osl]
    running: list[list] = []  # [context, tokens left]
    gaps: list[float] = []
    now, i = 0.0, 0
    while i < len(arrivals) or waiting or running:
        while i < len(arrivals) and arrivals[i][0] <= now:
            _, isl, osl = arrivals[i]
            waiting.append([arrivals[i][0], isl, isl, osl])
            i += 1
        if not waiting and not running:
            now = arrivals[i][0]
            continue
        decoding, context = len(running), sum(s[0] for s in running)
        budget, prefill, prefilled = args.max_batched_tokens - decoding, 0, []
        while waiting and budget > 0:
            w = waiting[0]
            take = min(budget, w[1])
            w[1] -= take
            budget -= take
            prefill += take
            if w[1]:
                break
            prefilled.append(waiting.pop(0))
        ms = poly.prefill_ms(StepShape(prefill, 0, 0, KV_TOKENS)) if prefill else 0.0
        if decoding:
            ms += poly.decode_ms(StepShape(0, decoding, context, KV_TOKENS))
        step = ms * scale
        now += step
        gaps.extend([step] * decoding)
        running = [[c + 1, left - 1] for c, left in running if left > 1]
        running += [[w[2], w[3] - 1] for w in prefilled if w[3] > 1]
    g = np.array(gaps) * 1000
    return float(np.percentile(g, 90)), float(g.mean())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_trace_arguments(parser)
    parser.add_argument("--max-batched-tokens", type=int, default=8192)
    parser.add_argument("--seconds", type=float, default=1500.0, help="simulated, per rate")
    parser.add_argument("--seeds", type=int, default=2)
    parser.add_argument("--rates", default="0.3,0.4,0.5,0.6,0.7,0.8,0.9", help="req/s (wall)")
    args = parser.parse_args()
    pairs = trace_pairs(args)
    isl = float(np.mean([p[0] for p in pairs]))
    osl = float(np.mean([p[1] for p in pairs]))
    profile = PerfProfile.load(profile_path(args))
    print(f"{len(pairs)} requests: mean ISL {isl:.0f}, OSL {osl:.0f}; gaps in wall ms")
    print("rate  sim p90  sim mean  model p90 (mean gap)  sim p90 / model")
    for rate in (float(r) for r in args.rates.split(",")):
        runs = [simulate(rate, pairs, args, seed) for seed in range(args.seeds)]
        p90 = float(np.mean([r[0] for r in runs]))
        mean = float(np.mean([r[1] for r in runs]))
        state = sizing.aggregated_state(profile, rate, isl, osl)
        model = state.itl_p90_s * 1000 if state else float("nan")
        print(f"{rate:4.2f}  {p90:7.1f}  {mean:8.1f}  {model:19.1f}  {p90 / model:15.2f}")


if __name__ == "__main__":
    main()
