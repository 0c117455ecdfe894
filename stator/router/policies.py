"""The simple policies: pure choices over the live (worker, dp_rank) candidates.

`load_of(key)` is a candidate's load by the measure the `kv` cost uses, less its prefix
term: `weight * prefill blocks in flight + active KV blocks`, as the router and its
replicas booked them and load reports corrected them (`WorkerLoad.load_blocks`). So on
traffic with no reuse, `least-loaded` and `kv` make the same choice. The load-blind
policies ignore it. The `kv` policy lives in `stator.router.cost`.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence

from stator.router.kv_index import WorkerKey

LoadOf = Callable[[WorkerKey], float]


class RoundRobin:
    def __init__(self, rng: random.Random) -> None:
        self._next = 0

    def select(self, candidates: Sequence[WorkerKey], load_of: LoadOf) -> WorkerKey:
        choice = candidates[self._next % len(candidates)]
        self._next += 1
        return choice


class RandomChoice:
    def __init__(self, rng: random.Random) -> None:
        self._rng = rng

    def select(self, candidates: Sequence[WorkerKey], load_of: LoadOf) -> WorkerKey:
        return self._rng.choice(list(candidates))


class PowerOfTwo:
    """Two candidates at random; the less loaded one wins (ties: the first drawn)."""

    def __init__(self, rng: random.Random) -> None:
        self._rng = rng

    def select(self, candidates: Sequence[WorkerKey], load_of: LoadOf) -> WorkerKey:
        if len(candidates) == 1:
            return candidates[0]
        a, b = self._rng.sample(list(candidates), 2)
        return b if load_of(b) < load_of(a) else a


class LeastLoaded:
    """The candidate with the least load; ties at random, so that an idle fleet is not
    always entered by its first worker."""

    def __init__(self, rng: random.Random) -> None:
        self._rng = rng

    def select(self, candidates: Sequence[WorkerKey], load_of: LoadOf) -> WorkerKey:
        loads = [load_of(c) for c in candidates]
        least = min(loads)
        tied = [c for c, n in zip(candidates, loads, strict=True) if n == least]
        return tied[0] if len(tied) == 1 else self._rng.choice(tied)


Policy = RoundRobin | RandomChoice | PowerOfTwo | LeastLoaded

SIMPLE_POLICIES: dict[str, type[Policy]] = {
    "round-robin": RoundRobin,
    "random": RandomChoice,
    "power-of-two": PowerOfTwo,
    "least-loaded": LeastLoaded,
}


def make_policy(mode: str, rng: random.Random | None = None) -> Policy:
    cls = SIMPLE_POLICIES.get(mode)
    if cls is None:
        raise ValueError(f"{mode!r} is not a simple policy (have {sorted(SIMPLE_POLICIES)})")
    return cls(rng or random.Random())
