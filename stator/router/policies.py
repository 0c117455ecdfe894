"""Load-blind policies: pure choices over the live worker ids."""

from __future__ import annotations

import random
from collections.abc import Sequence


class RoundRobin:
    def __init__(self) -> None:
        self._next = 0

    def select(self, workers: Sequence[int]) -> int:
        choice = workers[self._next % len(workers)]
        self._next += 1
        return choice


class RandomChoice:
    def __init__(self, seed: int | None = None) -> None:
        self._rng = random.Random(seed)

    def select(self, workers: Sequence[int]) -> int:
        return self._rng.choice(list(workers))


def make_policy(mode: str) -> RoundRobin | RandomChoice:
    if mode == "round-robin":
        return RoundRobin()
    if mode == "random":
        return RandomChoice()
    raise ValueError(f"unknown router mode {mode!r}")
