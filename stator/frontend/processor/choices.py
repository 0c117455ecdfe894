"""`n` fanned out: each choice of a request is its own engine request.

Both processors build one `EngineRequest` per prompt and hand it here; choice `c` of it
gets its own request id and, when the request is seeded, its own seed far from the others
(so choices differ, and the same request gives the same choices again).
"""

from __future__ import annotations

from collections.abc import Callable

import msgspec

from stator.protocols import EngineRequest

_SEED_STEP = 0x9E3779B97F4A7C15  # golden-ratio step: choice seeds far apart, reproducible
_SEED_MASK = (1 << 63) - 1


def choice_seed(seed: int | None, index: int) -> int | None:
    """Seed of choice `index` of a request seeded with `seed` (choice 0 keeps it)."""
    if seed is None or index == 0:
        return seed
    return (seed + index * _SEED_STEP) & _SEED_MASK


def fan_out(
    request: EngineRequest,
    request_id: str,
    prompt_index: int,
    n: int,
    seed_of: Callable[[int | None, int], int | None] = choice_seed,
) -> list[EngineRequest]:
    """The `n` engine requests of one prompt, indexed `prompt_index * n + choice`; the
    request of index 0 keeps `request_id`. `seed_of(seed, choice)`: each choice's seed."""
    if n == 1 and request.sampling.n == 1 and request.request_id == request_id and not prompt_index:
        return [request]  # the common case: nothing to change
    sampling = msgspec.structs.replace(request.sampling, n=1)
    out = []
    for c in range(n):
        index = prompt_index * n + c
        choice_sampling = (
            msgspec.structs.replace(sampling, seed=seed_of(sampling.seed, c)) if c else sampling
        )
        out.append(
            msgspec.structs.replace(
                request,
                request_id=request_id if index == 0 else f"{request_id}-{index}",
                sampling=choice_sampling,
            )
        )
    return out
