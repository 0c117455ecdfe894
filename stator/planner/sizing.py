"""How many workers a role needs for a load and latency targets, from a `PerfProfile`.
Pure functions; the formulas are Dynamo's planner's (docs: dynamo.md §8.3) plus a
queueing term, and a model of aggregated workers Dynamo does not have in this form.

- Prefill worker: a lone prompt of ISL tokens takes P = ttft(ISL). Prompts queue: with
  utilization ρ = rate·P, the mean wait of an M/D/1 queue is ρ·P / (2(1 − ρ)), so the
  TTFT target T holds while ρ ≤ 2k / (1 + 2k) with k = T/P − 1. Workers = ⌈rate·P / ρ⌉.
- Decode worker: the largest batch B whose step time at context ISL + OSL/2 meets the ITL
  target (binary search); a worker then serves B / (OSL · itl(B)) requests per second.
- Aggregated worker: prefill steals ρ = rate·P of each second from decoding, so output
  tokens come itl(B)/(1 − ρ) apart in the mean; the batch B is set by Little's law
  (B = rate · OSL · mean gap). A step that carries a prefill chunk is slow: such steps
  must stay under 8% of all steps. The p90 gap is then the mean gap, not the plain decode
  step: a gap is drawn in proportion to the batch that makes it (a big batch makes more
  gaps, each longer), and prompt lengths spread the context. Measured on a simulation of
  a mocker worker fed the Mooncake mix (`benchmarks/planner_model.py`: mean ISL 11k, OSL
  342, 0.3–0.9 req/s), the p90 gap is 0.94–1.07× the simulated mean gap and 1.07–1.20×
  this formula's mean gap at every rate, where the plain decode step missed it by
  1.4–1.8×, the more the busier the worker (which an additive correction cannot follow).
  The near-constant ratio is left to the planner's multiplicative ITL correction. TTFT
  is the p90 prompt's prefill plus the M/D/1 wait plus one step. The rate a worker
  sustains is the largest that meets every constraint (bisection).
- TTFT targets are p90s: the p90 is the TTFT of the p90 prompt (`isl_p90`, from the
  frontend's ISL histogram) after the mean wait, not the mean prompt's; on the Mooncake
  mix (ISL spread 0.9× the mean) the two are 2–3× apart.

`slow` scales the profile's latencies (the planner's correction factors): prefill times by
`slow_prefill`, decode steps by `slow_decode`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from stator.planner.profile import PerfProfile

# Share of steps that may carry prefill work before p90 ITL lands on such a step.
_PREFILL_STEP_SHARE = 0.08


@dataclass(frozen=True, slots=True)
class Sizing:
    workers: int
    per_worker_rps: float  # requests/s one worker sustains within the targets
    note: str = ""


def _workers(rate: float, per_worker: float) -> int:
    if rate <= 0:
        return 0
    if per_worker <= 0:
        return 10**6  # cannot meet the target at any size: the caller clamps to its max
    return math.ceil(rate / per_worker - 1e-9)


def _rho_max(target_s: float, service_s: float, p90_s: float | None = None) -> float:
    """Utilization up to which the p90 prompt's service (`p90_s`, default the mean's) +
    the M/D/1 wait of mean services stays within target."""
    k = (target_s - (p90_s or service_s)) / service_s
    return 0.0 if k <= 0 else 2 * k / (1 + 2 * k)


def prefill(
    profile: PerfProfile,
    rate: float,
    isl: float,
    ttft_ms: float,
    slow: float = 1.0,
    isl_p90: float | None = None,
) -> Sizing:
    p = profile.ttft_ms(isl) * slow / 1000
    p90 = profile.ttft_ms(isl_p90) * slow / 1000 if isl_p90 else p
    rho = _rho_max(ttft_ms / 1000, p, p90)
    if rho <= 0:
        return Sizing(_workers(rate, 0), 0.0, f"a lone {isl:.0f}-token prompt misses the TTFT")
    return Sizing(_workers(rate, rho / p), rho / p)


def decode(
    profile: PerfProfile, rate: float, isl: float, osl: float, itl_ms: float, slow: float = 1.0
) -> Sizing:
    context = isl + osl / 2
    batch = profile.best_decode_batch(itl_ms / slow, context)
    if batch is None:
        return Sizing(_workers(rate, 0), 0.0, "one sequence alone misses the ITL")
    step = profile.itl_ms(batch, context) * slow / 1000
    per_worker = batch / (max(osl, 1.0) * step)
    return Sizing(_workers(rate, per_worker), per_worker)


@dataclass(frozen=True, slots=True)
class AggregatedState:
    """What an aggregated worker looks like at a request rate."""

    rho: float  # share of time spent prefilling
    batch: float
    step_s: float  # mean gap between decode steps
    itl_p90_s: float
    ttft_s: float


def aggregated_state(
    profile: PerfProfile,
    rate: float,
    isl: float,
    osl: float,
    slow_prefill: float = 1.0,
    slow_decode: float = 1.0,
    isl_p90: float | None = None,
) -> AggregatedState | None:
    """None when the worker cannot keep up at all (prefill alone saturates it). The
    TTFT is the p90 prompt's (`isl_p90`; default: the mean prompt's) after the mean wait."""
    p = profile.ttft_ms(isl) * slow_prefill / 1000
    p90 = profile.ttft_ms(isl_p90) * slow_prefill / 1000 if isl_p90 else p
    rho = rate * p
    if rho >= 1:
        return None
    context = isl + osl / 2
    batch, step = 1.0, profile.itl_ms(1, context) * slow_decode / 1000 / (1 - rho)
    for _ in range(30):  # fixed point of Little's law; converges fast for sane profiles
        batch = max(1.0, rate * max(osl, 1.0) * step)
        new = profile.itl_ms(batch, context) * slow_decode / 1000 / (1 - rho)
        if abs(new - step) < 1e-6:
            break
        step = new
    if batch > profile.max_batch(context):
        return None
    chunk = min(isl, profile.max_num_batched_tokens or isl)
    chunks = math.ceil(isl / chunk) if chunk else 1
    decode_step = step * (1 - rho)  # a step with no prefill in it
    prefill_step = profile.ttft_ms(chunk) * slow_prefill / 1000 + decode_step
    share = rate * chunks * step  # steps carrying prefill / all steps
    # While prefill steps are rarer than 1 in 12, the p90 gap is the mean gap (module
    # docstring); past that, the p90 lands on a step that carries a prefill chunk.
    itl_p90 = prefill_step if share > _PREFILL_STEP_SHARE else step
    ttft = p90 + rho * p / (2 * (1 - rho)) + step
    return AggregatedState(rho, batch, step, itl_p90, ttft)


def aggregated(
    profile: PerfProfile,
    rate: float,
    isl: float,
    osl: float,
    ttft_ms: float,
    itl_ms: float,
    slow_prefill: float = 1.0,
    slow_decode: float = 1.0,
    isl_p90: float | None = None,
) -> Sizing:
    def meets(r: float) -> bool:
        state = aggregated_state(profile, r, isl, osl, slow_prefill, slow_decode, isl_p90)
        return (
            state is not None
            and state.ttft_s * 1000 <= ttft_ms
            and state.itl_p90_s * 1000 <= itl_ms
        )

    p = profile.ttft_ms(isl) * slow_prefill / 1000
    lo, hi = 0.0, 1.0 / p
    if not meets(1e-6):
        return Sizing(_workers(rate, 0), 0.0, "a lone request misses the targets")
    for _ in range(40):
        mid = (lo + hi) / 2
        if meets(mid):
            lo = mid
        else:
            hi = mid
    return Sizing(_workers(rate, lo), lo)
