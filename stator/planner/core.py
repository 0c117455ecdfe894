"""The planner's pure core: observations in, worker counts out. No I/O, no clock: time is
the observation's, so a recorded log of observations replays to the same decisions.

One `RolePlanner` per (pool, role); `Planner` routes each observation to its own. Policies:

- `sla`: predict the next interval's request rate, and the mix (mean ISL, OSL, p90 ISL)
  from past intervals, then size the role with `sizing` so the profile meets the targets
  (× `sla_headroom`). What the model misses is learned from each interval, at the load
  it had, as two factors, observed p90 / modelled (the median of the last six, each
  0.5–4), that divide their targets: TTFT's and ITL's (the p90 gap is a steady multiple
  of the modelled mean gap, `sizing`). They correct the modelled latency, not the
  engine's service time: scaling the service time would also scale the modelled
  utilization, and a p90 that is long because some prompts are long does not make the
  queue any busier.
- `load`: one worker more when any worker's KV usage or queue is over its threshold, one
  fewer when all are under the low thresholds.

Both clamp to [min, max] and the pool's GPU budget and respect cooldowns: scaling up may
follow any change after `scale_up_cooldown`; scaling down waits `scale_down_cooldown`
after any change and removes at most `scale_down_step` workers at a time.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field

import msgspec

from stator.planner import sizing
from stator.planner.config import PlannerConfig
from stator.planner.profile import PerfProfile


class WorkerLoad(msgspec.Struct, kw_only=True, omit_defaults=True):
    kv_usage: float = 0.0  # active / total KV blocks
    queued_prefill_tokens: int = 0
    waiting: int = 0
    context_length: int = 0


class RoleObservation(msgspec.Struct, kw_only=True, omit_defaults=True):
    """One interval of one role of one pool, as the metrics reader saw it."""

    pool: str
    role: str = "aggregated"  # aggregated | prefill | decode
    workers: int  # the connector's target count (ready + starting)
    ready: int | None = None
    requests: int = 0  # requests that arrived in the interval
    isl: float = 0.0  # mean prompt tokens
    osl: float = 0.0  # mean output tokens
    isl_p90: float = 0.0  # p90 prompt tokens (0: unknown, the mean stands in)
    ttft_p90_ms: float | None = None
    itl_p90_ms: float | None = None
    loads: list[WorkerLoad] = msgspec.field(default_factory=list)


class Observation(msgspec.Struct, kw_only=True):
    time: float  # seconds, any origin
    interval: float  # seconds this observation covers
    roles: list[RoleObservation]


class Decision(msgspec.Struct, kw_only=True, omit_defaults=True):
    time: float
    pool: str
    role: str
    current: int
    desired: int
    reason: str
    predicted_rps: float | None = None
    predicted_isl: float | None = None
    predicted_osl: float | None = None
    correction: float | None = None  # TTFT: observed / modelled
    itl_correction: float | None = None  # ITL: observed / modelled

    @property
    def changed(self) -> bool:
        return self.desired != self.current


def predict(values: list[float], how: str, window: int) -> float:
    """The next value of a series."""
    recent = values[-window:]
    if not recent:
        return 0.0
    if how == "constant" or len(recent) == 1:
        return recent[-1]
    if how == "moving-average":
        return statistics.fmean(recent)
    if how == "max":
        return max(recent)
    # trend: least-squares line through the window, one step ahead; never below the last
    # value when rising (a doubling must not be under-forecast) and never negative.
    n = len(recent)
    xs = range(n)
    mx, my = (n - 1) / 2, statistics.fmean(recent)
    sxx = sum((x - mx) ** 2 for x in xs)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, recent, strict=True)) / sxx
    ahead = my + slope * (n - mx)
    return max(0.0, max(ahead, recent[-1]) if slope > 0 else ahead)


@dataclass
class RolePlanner:
    config: PlannerConfig
    profile: PerfProfile | None
    pool: str
    role: str
    rates: list[float] = field(default_factory=list)
    # (requests, ISL, OSL, p90 ISL) per interval
    mix: list[tuple[int, float, float, float]] = field(default_factory=list)
    correction: float = 1.0  # TTFT: observed / modelled
    itl_correction: float = 1.0  # ITL: observed / modelled
    ttft_ratios: list[float] = field(default_factory=list)
    itl_ratios: list[float] = field(default_factory=list)
    last_change: float = -math.inf

    def tick(self, now: float, interval: float, obs: RoleObservation) -> Decision:
        if obs.requests and obs.isl:
            self.mix.append((obs.requests, obs.isl, obs.osl, obs.isl_p90 or obs.isl))
        self.rates.append(obs.requests / interval)
        if self.config.policy == "sla":
            desired, reason, extra = self._sla(obs)
        else:
            desired, reason, extra = self._load(obs)
        desired, reason = self._bounded(now, obs.workers, desired, reason)
        if desired != obs.workers:
            self.last_change = now
        return Decision(
            time=now,
            pool=self.pool,
            role=self.role,
            current=obs.workers,
            desired=desired,
            reason=reason,
            **extra,
        )

    # -- policies --------------------------------------------------------------------

    def _sla(self, obs: RoleObservation) -> tuple[int, str, dict]:
        c = self.config
        assert self.profile is not None, "the sla policy needs a profile"
        rate = predict(self.rates, c.load_predictor, c.predictor_window)
        isl, osl, isl_p90 = self._mix()
        if c.correction:
            self._correct(obs)
        extra = {
            "predicted_rps": round(rate, 4),
            "predicted_isl": round(isl, 1),
            "predicted_osl": round(osl, 1),
            "correction": round(self.correction, 3),
            "itl_correction": round(self.itl_correction, 3),
        }
        if rate <= 0 or not self.mix:
            return c.min_workers, "no load", extra
        ttft = c.ttft_target * c.sla_headroom / self.correction
        itl = c.itl_target * c.sla_headroom / self.itl_correction
        if self.role == "prefill":
            size = sizing.prefill(self.profile, rate, isl, ttft, isl_p90=isl_p90)
        elif self.role == "decode":
            size = sizing.decode(self.profile, rate, isl, osl, itl)
        else:
            size = sizing.aggregated(self.profile, rate, isl, osl, ttft, itl, isl_p90=isl_p90)
        reason = f"{rate:.2f} req/s at {size.per_worker_rps:.2f} per worker"
        return size.workers, reason + (f" ({size.note})" if size.note else ""), extra

    def _mix(self) -> tuple[float, float, float]:
        """The predicted ISL, OSL and p90 ISL: the request-weighted means of the last
        `mix_window` intervals. The mix changes slowly while one interval's mean is noisy
        (on the Mooncake trace, with a prompt-length spread of 0.9× the mean, eight
        requests' mean ISL is off by a third of it); a short window made one interval of
        long prompts halve the modelled capacity."""
        recent = self.mix[-self.config.mix_window :]
        n = sum(m[0] for m in recent)
        if not n:
            return 0.0, 0.0, 0.0
        isl, osl, isl_p90 = (sum(m[0] * m[k] for m in recent) / n for k in (1, 2, 3))
        return isl, osl, isl_p90

    def _correct(self, obs: RoleObservation) -> None:
        """Move the correction factors toward observed / modelled p90 at this interval's
        worker count, the mix, and the rate of the last two intervals (a gap's p90 is
        set by the sequences admitted over the last several seconds, not only in this
        interval)."""
        workers = obs.ready or obs.workers
        if obs.requests < 5 or not workers or self.profile is None:
            return
        if sum(m[0] for m in self.mix[-self.config.mix_window :]) < _MIX_MIN:
            return  # the first requests to finish are the short ones: no mix to model yet
        rate = statistics.fmean(self.rates[-2:]) / workers
        isl, osl, isl_p90 = self._mix()
        ttft_ratio = itl_ratio = None
        if self.role == "aggregated":
            state = sizing.aggregated_state(self.profile, rate, isl, osl, isl_p90=isl_p90)
            # Learn only where the model says the fleet kept up: past that (a load step
            # the fleet has not caught up with yet) the p90s are queues and prefill stalls
            # the model does not claim to know, and their ratio would read as a fleet
            # several times slower than it is (measured in benchmarks/planner_sim.py: a
            # burst on 2 workers took both factors to 2.5 and the fleet to its maximum).
            if state is None or state.ttft_s * 1000 > self.config.ttft_target:
                return
            if state.itl_p90_s * 1000 > self.config.itl_target:
                return
            if obs.ttft_p90_ms is not None:
                ttft_ratio = obs.ttft_p90_ms / 1000 / state.ttft_s
            # The ITL ratio falls as the load rises (a light load's gaps are the burstier;
            # on benchmarks/planner_sim.py 1.2-1.45x the model at a quarter of a worker's
            # capacity, 1.05-1.1x near it) and sizing only asks what holds near the
            # target: a ratio learned at a light load put 6-7 workers where 5 met the
            # targets. So it is learned where the model puts the p90 gap near the target,
            # or where the fleet misses what the planner aims for (whatever the model
            # says, a fleet over its target is slower than the model).
            itl_ms, c = state.itl_p90_s * 1000, self.config
            if obs.itl_p90_ms is not None and (
                itl_ms >= _ITL_LEARN_SHARE * c.itl_target
                or obs.itl_p90_ms > c.itl_target * c.sla_headroom
            ):
                itl_ratio = obs.itl_p90_ms / itl_ms
        elif self.role == "prefill" and obs.ttft_p90_ms is not None:
            p = self.profile.ttft_ms(isl) / 1000
            rho = min(0.95, rate * p)
            p90 = self.profile.ttft_ms(isl_p90) / 1000
            ttft_ratio = obs.ttft_p90_ms / 1000 / (p90 + rho * p / (2 * (1 - rho)))
        elif self.role == "decode" and obs.itl_p90_ms is not None:
            context = isl + osl / 2
            batch = max(1.0, rate * osl * obs.itl_p90_ms / 1000)
            itl_ratio = obs.itl_p90_ms / self.profile.itl_ms(batch, context)
        if ttft_ratio is not None:
            self.correction = _robust(self.ttft_ratios, ttft_ratio)
        if itl_ratio is not None:
            self.itl_correction = _robust(self.itl_ratios, itl_ratio)

    def _load(self, obs: RoleObservation) -> tuple[int, str, dict]:
        c = self.config
        loads = obs.loads
        if not loads:
            return obs.workers, "no load reports", {}

        def queue(w: WorkerLoad) -> float:
            tokens = w.queued_prefill_tokens / w.context_length if w.context_length else 0.0
            return max(tokens, float(w.waiting))

        if any(w.kv_usage > c.kv_usage_up or queue(w) > c.queue_up for w in loads):
            return obs.workers + 1, "a worker is over its KV or queue threshold", {}
        if obs.workers > 1 and all(
            w.kv_usage < c.kv_usage_down and queue(w) < c.queue_down for w in loads
        ):
            return obs.workers - 1, "every worker is under the low thresholds", {}
        return obs.workers, "within thresholds", {}

    # -- bounds and cooldowns --------------------------------------------------------

    def _bounded(self, now: float, current: int, desired: int, reason: str) -> tuple[int, str]:
        c = self.config
        if desired < c.min_workers:
            desired, reason = c.min_workers, reason + f"; min {c.min_workers}"
        if desired > c.max_workers:
            desired, reason = c.max_workers, reason + f"; max {c.max_workers}"
        if c.max_gpu_budget:
            cap = c.max_gpu_budget // c.gpus_per_worker
            if desired > cap:
                desired, reason = cap, reason + f"; GPU budget {c.max_gpu_budget}"
        since = now - self.last_change
        if desired > current and since < c.scale_up_cooldown:
            return current, reason + f"; scale-up cooldown ({since:.0f}s)"
        if desired < current:
            if since < c.scale_down_cooldown:
                return current, reason + f"; scale-down cooldown ({since:.0f}s)"
            desired = max(desired, current - c.scale_down_step)
        return desired, reason


_ITL_LEARN_SHARE = 0.7  # of the ITL target: where an ITL ratio is learned (`_correct`)
_RATIO_WINDOW = 6
_RATIO_MIN = 3
_MIX_MIN = 30  # requests in the mix window before a ratio is taken


def _robust(ratios: list[float], ratio: float) -> float:
    """A correction factor: the median of the last six observed / modelled ratios, each
    within 0.5–4, and 1 until there are three. A median, not a moving mean: one interval
    of a burst the fleet had not caught up with (p90 ITL 700 ms where the model said 30)
    must not move the factor, while a real change shows in four intervals of six."""
    ratios.append(min(4.0, max(0.5, ratio)))
    del ratios[:-_RATIO_WINDOW]
    return statistics.median(ratios) if len(ratios) >= _RATIO_MIN else 1.0


class Planner:
    """Every (pool, role)'s planner. `tick(observation)` -> one decision per role seen."""

    def __init__(self, config: PlannerConfig, profile: PerfProfile | None = None) -> None:
        config.validate()
        if config.policy == "sla" and profile is None:
            raise ValueError("--policy sla needs --profile (from `stator profile`)")
        self.config = config
        self.profile = profile
        self.roles: dict[tuple[str, str], RolePlanner] = {}

    def tick(self, observation: Observation) -> list[Decision]:
        decisions = []
        for obs in observation.roles:
            key = (obs.pool, obs.role)
            planner = self.roles.get(key)
            if planner is None:
                planner = self.roles[key] = RolePlanner(self.config, self.profile, *key)
            decisions.append(planner.tick(observation.time, observation.interval, obs))
        self._share_budget(decisions)
        return decisions

    def _share_budget(self, decisions: list[Decision]) -> None:
        """Within a pool, prefill and decode share the GPU budget: trim the role that asks
        for the most above what it has."""
        budget = self.config.max_gpu_budget // self.config.gpus_per_worker
        if not budget:
            return
        by_pool: dict[str, list[Decision]] = {}
        for d in decisions:
            by_pool.setdefault(d.pool, []).append(d)
        for pool_decisions in by_pool.values():
            while sum(d.desired for d in pool_decisions) > budget:
                d = max(pool_decisions, key=lambda d: (d.desired - d.current, d.desired))
                if d.desired <= max(1, self.config.min_workers):
                    break
                d.desired -= 1
                d.reason += f"; pool GPU budget {self.config.max_gpu_budget}"


def replay(config: PlannerConfig, profile: PerfProfile | None, lines: list[str]) -> list[Decision]:
    """Decisions for a recorded log (one JSON `Observation` per line)."""
    planner = Planner(config, profile)
    decoder = msgspec.json.Decoder(Observation)
    out: list[Decision] = []
    for line in lines:
        if line.strip():
            out.extend(planner.tick(decoder.decode(line)))
    return out
