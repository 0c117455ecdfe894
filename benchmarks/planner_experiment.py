"""The experiment both planner benchmarks run: `planner.py` on real processes and
`planner_sim.py` on a simulated fleet. One definition of the trace replay (the Mooncake
trace sampled, its rate doubled halfway), of the planner variants and of the scoring per
interval, so that the two measure the same thing and a setting compared in simulation is
the one the real run uses.

The trace's window [start, start + H) is replayed at its own rate, then [start + H,
start + 3H) at twice its rate (so both halves last H of trace time); every time is divided
by `--time-scale` (the workers run that much faster, so the fleet sees the trace's load in
simulated time). Latencies are scored in simulated ms (wall × time scale).

Planner variants: A = SLA policy, defaults; B = SLA with min 2 workers; C = SLA with min
4; D = SLA with min 2, the load predicted as the mean of the last 3 intervals (a 10 s
interval holds 5-25 requests: a trend through them chases Poisson noise) and planned at
0.9 of each target; E = D with min 3; F = D with min 4; L = the load policy (KV / queue
thresholds).
"""

from __future__ import annotations

import argparse
import json
import math
import random
from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np

from stator.planner.config import PlannerConfig


def add_trace_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags of the replayed trace and of the workers' speed."""
    add = parser.add_argument
    add("--trace", default="/work/shared/data/mooncake/conversation_trace.jsonl")
    add("--trace-start", type=float, default=600.0, help="trace second to start at")
    add("--half", type=float, default=180.0, help="trace seconds of each half")
    add("--sample", type=float, default=0.25, help="share of the trace's requests sent")
    add("--max-input-tokens", type=int, default=32768)
    add("--slowdown", type=float, default=4.0, help="worker times x this (a slower GPU)")
    add("--time-scale", type=float, default=2.0, help="wall = simulated / this")
    add(
        "--profile",
        help="the workers' PerfProfile (default: /tmp/stator-planner-bench-profile-tsN.json "
        "for time scale N; planner.py measures it there when it is missing)",
    )


def profile_path(args) -> str:
    """The profile must be measured at the workers' speed: one file per time scale."""
    return args.profile or f"/tmp/stator-planner-bench-profile-ts{args.time_scale:g}.json"


def add_arguments(parser: argparse.ArgumentParser, runs: str) -> None:
    """The flags of the experiment, the same in both planner benchmarks."""
    add_trace_arguments(parser)
    add = parser.add_argument
    add("--ttft-target", type=float, default=4000.0, help="p90, simulated ms")
    add("--itl-target", type=float, default=60.0, help="p90, simulated ms")
    add("--interval", type=float, default=15.0, help="scoring window, simulated s")
    add("--planner-interval", type=float, default=10.0, help="simulated s")
    add("--cooldown", type=float, default=60.0, help="scale-down, simulated s")
    add("--max-workers", type=int, default=8)
    add("--runs", default=runs, help='e.g. "planner:C,F static:4,5"')


def runs(text: str) -> list[tuple[str, str]]:
    """`"planner:C,F static:4,5"` -> [("planner", "C"), ("planner", "F"), ...]."""
    out = []
    for group in text.split():
        kind, _, names = group.partition(":")
        out += [(kind, name) for name in names.split(",")]
    return out


@dataclass
class TraceRequest:
    at: float  # wall seconds from the start of the replay
    row: dict  # the trace's line (hash_ids for the prompt's shared blocks)
    isl: int
    osl: int


def trace_requests(args, seed: int = 0) -> Iterator[TraceRequest]:
    """The sampled requests of the replay, in order; seed 0 is the benchmarks' sample."""
    a, h = args.trace_start, args.half
    rng = random.Random(seed)
    with open(args.trace) as f:
        for line in f:
            row = json.loads(line)
            t = row["timestamp"] / 1000
            if t < a:
                continue
            if t >= a + 3 * h:
                break
            if args.sample < 1 and rng.random() >= args.sample:
                continue
            sim = t - a if t < a + h else h + (t - a - h) / 2  # second half: twice the rate
            isl = max(1, min(row["input_length"], args.max_input_tokens))
            yield TraceRequest(sim / args.time_scale, row, isl, max(1, row["output_length"]))


@dataclass
class Record:
    at: float
    ttft: float | None = None
    gaps: list[tuple[float, float]] = field(default_factory=list)  # (time, gap)
    error: str | None = None


def pct(values: list[float], p: float) -> float:
    return float(np.percentile(values, p)) if values else math.nan


def intervals(records: list[Record], args) -> list[dict]:
    """Per simulated interval: p90 TTFT of requests arriving in it, p90 ITL of the gaps
    that ended in it (both simulated ms), and whether both meet the targets."""
    width = args.interval / args.time_scale
    end = max((r.at for r in records), default=0.0)
    n = max(1, math.ceil(end / width))
    ttfts: list[list[float]] = [[] for _ in range(n)]
    gaps: list[list[float]] = [[] for _ in range(n)]
    for r in records:
        if r.ttft is not None:
            ttfts[min(n - 1, int(r.at / width))].append(r.ttft * args.time_scale * 1000)
        for t, g in r.gaps:
            i = int(t / width)
            if i < n:
                gaps[i].append(g * args.time_scale * 1000)
    out = []
    for i in range(n):
        ttft, itl = pct(ttfts[i], 90), pct(gaps[i], 90)
        ok_ttft = not ttfts[i] or ttft <= args.ttft_target
        ok_itl = not gaps[i] or itl <= args.itl_target
        out.append(
            {"t": i * args.interval, "requests": len(ttfts[i]), "ttft_p90": ttft, "itl_p90": itl,
             "ok": ok_ttft and ok_itl}
        )  # fmt: skip
    return out


def share_met(windows: list[dict]) -> tuple[float, int]:
    """(share of the intervals with requests that met both targets, how many there were)."""
    scored = [w for w in windows if w["requests"]]
    return sum(w["ok"] for w in scored) / max(1, len(scored)), len(scored)


def variant_config(name: str, args) -> PlannerConfig:
    # The planner works in wall time: the targets and its interval are divided by the
    # time scale (the profile was measured at the same speedup).
    base = dict(
        ttft_target=args.ttft_target / args.time_scale,
        itl_target=args.itl_target / args.time_scale,
        adjustment_interval=args.planner_interval / args.time_scale,
        scale_down_cooldown=args.cooldown / args.time_scale,
        max_workers=args.max_workers,
        load_predictor="trend",
    )
    mean_of_3 = dict(load_predictor="moving-average", predictor_window=3, sla_headroom=0.9)
    variants = {
        "A": dict(),
        "B": dict(min_workers=2),
        "C": dict(min_workers=4),
        "D": dict(min_workers=2, **mean_of_3),
        "E": dict(min_workers=3, **mean_of_3),
        "F": dict(min_workers=4, **mean_of_3),
        "L": dict(policy="load", min_workers=1),
    }
    return PlannerConfig(**{**base, **variants[name]})
