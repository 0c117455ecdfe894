"""The KV router's choice: the worker with the lowest cost

    cost_w = weight * prefill_blocks_w + decode_blocks_w

where prefill_blocks_w is the prompt's uncached part on w plus the prefill w has been sent
and not finished (in blocks), and decode_blocks_w the KV blocks active on w once this
request is added there: those active now plus the prompt's blocks that no active request
on w holds yet (as in Dynamo). A longer cached prefix lowers the first term; a busy
worker raises both, so affinity never piles everything onto one worker. Ties go to the worker with the smaller cache (it has more room
and is the less likely to evict someone's prefix), then to chance. A temperature above
zero samples from softmax(-cost / (spread * temperature)) instead.

Pure: every input is passed in, randomness comes from the caller's `random.Random`.
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple

from stator.router.kv_index import WorkerKey


class Candidate(NamedTuple):
    """One (worker, dp_rank) as the cost sees it. A tuple: the router builds one per
    worker per request, and a tuple is the cheapest thing Python can build."""

    key: WorkerKey
    overlap_blocks: float  # leading prompt blocks cached there (lower tiers count less)
    cached_blocks: int  # everything cached on this worker (its "tree size")
    inflight_prefill_tokens: int
    active_blocks: int
    active_overlap: int = 0  # leading prompt blocks that active requests hold there


@dataclass(frozen=True, slots=True)
class Choice:
    key: WorkerKey
    overlap_blocks: float
    costs: dict[WorkerKey, float]


def cost(candidate: Candidate, prompt_tokens: int, block_size: int, weight: float) -> float:
    uncached = max(0, prompt_tokens - candidate.overlap_blocks * block_size)
    prefill_blocks = (uncached + candidate.inflight_prefill_tokens) / block_size
    new_blocks = max(0, -(-prompt_tokens // block_size) - candidate.active_overlap)
    return weight * prefill_blocks + candidate.active_blocks + new_blocks


def choose(
    candidates: Sequence[Candidate],
    prompt_tokens: int,
    block_size: int,
    weight: float,
    temperature: float,
    rng: random.Random,
) -> Choice:
    if not candidates:
        raise ValueError("no candidates to choose from")
    # cost(), inlined: this runs once per worker per request.
    prompt_blocks = -(-prompt_tokens // block_size)
    costs = {
        key: weight * (max(0, prompt_tokens - overlap * block_size) + queued) / block_size
        + active
        + max(0, prompt_blocks - active_overlap)
        for key, overlap, _, queued, active, active_overlap in candidates
    }
    if temperature > 0:
        chosen = _sample(candidates, costs, temperature, rng)
    else:
        best = min(costs.values())
        tied = [c for c in candidates if costs[c.key] == best]
        smallest = min(c.cached_blocks for c in tied)
        tied = [c for c in tied if c.cached_blocks == smallest]
        chosen = tied[0] if len(tied) == 1 else rng.choice(tied)
    return Choice(chosen.key, chosen.overlap_blocks, costs)


def _sample(
    candidates: Sequence[Candidate],
    costs: Mapping[WorkerKey, float],
    temperature: float,
    rng: random.Random,
) -> Candidate:
    values = [costs[c.key] for c in candidates]
    low, high = min(values), max(values)
    spread = high - low
    if spread == 0:
        return rng.choice(list(candidates))
    # Normalizing by the spread makes the temperature independent of the cost scale.
    weights = [math.exp(-(v - low) / spread / temperature) for v in values]
    return rng.choices(list(candidates), weights=weights, k=1)[0]
