"""Arrival times for open-loop load: Poisson, constant, or gamma (burstiness)."""

from __future__ import annotations

import random


def arrival_times(
    rate: float, count: int, process: str = "poisson", burstiness: float = 1.0, seed: int = 0
) -> list[float]:
    """Seconds after the start at which each of `count` requests is sent.

    Gamma inter-arrivals with shape `burstiness` and mean 1/rate: shape 1 is Poisson,
    below 1 burstier, above 1 smoother (vLLM's `--burstiness`)."""
    if rate <= 0:
        raise ValueError(f"request rate must be positive, got {rate}")
    if burstiness <= 0:
        raise ValueError(f"burstiness must be positive, got {burstiness}")
    rng = random.Random(f"{seed}:arrivals")
    times, t = [], 0.0
    for _ in range(count):
        times.append(t)
        if process == "constant":
            gap = 1.0 / rate
        elif process == "poisson":
            gap = rng.expovariate(rate)
        elif process == "gamma":
            gap = rng.gammavariate(burstiness, 1.0 / (rate * burstiness))
        else:
            raise ValueError(f"unknown arrival process {process!r}")
        t += gap
    return times
