"""The request streams `routing.py` replays against its simulated fleet: `shared-prefix`
(tenants' long system prompts, short questions, Poisson arrivals), `mooncake` (the Mooncake
conversation trace at its timestamps, each 512-token hash id as 512 fixed tokens) and
`no-reuse` (unique prompts), and each stream's perfect-cache bound. The options they read
are `routing.py`'s (see its docstring).
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass

import numpy as np

from stator.kv.hashing import block_hashes


@dataclass
class Arrival:
    at: float  # seconds from the start
    tokens: list[int]
    max_tokens: int
    measured: bool = True  # False: warm-up traffic, sent but not in the numbers


def poisson_times(rng: random.Random, rate: float, count: int) -> list[float]:
    t, out = 0.0, []
    for _ in range(count):
        t += rng.expovariate(rate)
        out.append(t)
    return out


def shared_prefix(args, rng: random.Random) -> list[Arrival]:
    prompts = [
        [rng.randrange(32000) for _ in range(args.system_tokens)] for _ in range(args.tenants)
    ]
    return [
        Arrival(
            at,
            prompts[rng.randrange(args.tenants)]
            + [rng.randrange(32000) for _ in range(args.question_tokens)],
            args.output_tokens,
        )
        for at in poisson_times(rng, args.rate, args.requests)
    ]


def no_reuse(args, rng: random.Random) -> list[Arrival]:
    return [
        Arrival(at, [rng.randrange(32000) for _ in range(args.unique_tokens)], args.output_tokens)
        for at in poisson_times(rng, args.rate, args.requests)
    ]


def mooncake(args, rng: random.Random) -> list[Arrival]:
    """The trace from `trace_start - warmup` to `trace_start + duration * time_scale`
    seconds of trace time; what comes before `trace_start` warms the fleet's caches (and
    loads it) but is not measured."""
    first = max(0.0, args.trace_start - args.warmup)
    end = args.trace_start + args.duration * args.time_scale
    block: dict[int, list[int]] = {}
    out = []
    with open(args.trace) as f:
        for line in f:
            row = json.loads(line)
            t = row["timestamp"] / 1000
            if t < first:
                continue
            if t > end:
                break
            tokens: list[int] = []
            for hid in row["hash_ids"]:
                if hid not in block:
                    block[hid] = np.random.default_rng(hid).integers(0, 32000, 512).tolist()
                tokens.extend(block[hid])
            length = min(row["input_length"], args.max_input_tokens)
            out.append(
                Arrival(
                    (t - first) / args.time_scale,
                    tokens[:length],
                    min(row["output_length"], args.max_output),
                    measured=t >= args.trace_start,
                )
            )
    return out


WORKLOADS = {"shared-prefix": shared_prefix, "mooncake": mooncake, "no-reuse": no_reuse}


def perfect_cache_hit(arrivals: list[Arrival], block_size: int) -> float:
    """The prefix hit rate of one infinite cache that every request reaches: prompt
    tokens of measured requests whose block was already computed by an earlier request
    (a leading run, as engines match), over all measured prompt tokens. Warm-up requests
    fill the cache but are not counted. As in the mocker, the last block is always
    computed. No router can beat this; the gap to it is what routing or eviction lost."""
    seen: set[int] = set()
    hit = total = 0
    for arrival in arrivals:
        hashes = block_hashes(arrival.tokens, block_size)
        limit = (len(arrival.tokens) - 1) // block_size
        depth = 0
        while depth < limit and hashes[depth] in seen:
            depth += 1
        seen.update(hashes)
        if arrival.measured:
            hit += depth * block_size
            total += len(arrival.tokens)
    return hit / total if total else 0.0
