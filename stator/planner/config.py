"""`PlannerConfig`: the flags of `stator planner` (and the pure core's settings)."""

from __future__ import annotations

from dataclasses import dataclass

from stator.config import option

POLICIES = ["sla", "load"]
PREDICTORS = ["constant", "moving-average", "trend", "max"]
ROLES = ["aggregated", "prefill", "decode"]


@dataclass
class PlannerConfig:
    policy: str = option(
        "sla",
        "sla: size each role from the predicted load and the profile to meet the TTFT/ITL "
        "targets; load: step one worker up/down on KV usage and queue thresholds",
        choices=POLICIES,
    )
    profile: str | None = option(
        None, "Worker profile from `stator profile` (required by --policy sla)", metavar="FILE"
    )
    ttft_target: float = option(500.0, "p90 TTFT target in ms")
    itl_target: float = option(50.0, "p90 ITL target in ms")
    adjustment_interval: float = option(10.0, "Seconds between planning decisions")
    load_predictor: str = option(
        "trend",
        "How the next interval's load is predicted from past intervals",
        choices=PREDICTORS,
    )
    predictor_window: int = option(6, "Past intervals the rate predictor looks at")
    mix_window: int = option(
        12,
        "Past intervals whose requests the ISL/OSL prediction averages (the mix changes "
        "slowly, the rate fast)",
    )
    sla_headroom: float = option(
        0.8,
        "Plan for this fraction of each target (room for bursts within an interval and for "
        "the predictor's lag)",
    )
    correction: bool = option(
        True,
        "Scale the profile's latencies by observed/predicted (median of 6, 0.5-4x): the fleet "
        "is slower than a lone worker profiled in isolation",
    )
    min_workers: int = option(1, "Fewest workers per role and pool")
    max_workers: int = option(8, "Most workers per role and pool")
    max_gpu_budget: int = option(0, "Most GPUs over all roles of a pool (0: no limit)")
    gpus_per_worker: int = option(1, "GPUs one worker uses")
    scale_up_cooldown: float = option(0.0, "Seconds after a change before scaling up again")
    scale_down_cooldown: float = option(
        30.0, "Seconds after any change before scaling down (avoids flapping)"
    )
    scale_down_step: int = option(1, "Most workers removed per decision")
    # load policy
    kv_usage_up: float = option(0.85, "load policy: scale up when a worker's KV usage exceeds this")
    kv_usage_down: float = option(
        0.3, "load policy: scale down when every worker's KV usage is below this"
    )
    queue_up: float = option(
        1.0,
        "load policy: scale up when a worker's queued prefill tokens exceed this many "
        "context lengths, or waiting requests exceed this many per worker",
    )
    queue_down: float = option(0.1, "load policy: scale down when every queue is below this")
    advisory: bool = option(False, "Compute and log decisions without applying them")

    def validate(self) -> None:
        if self.policy not in POLICIES:
            raise ValueError(f"--policy must be one of {POLICIES}, got {self.policy!r}")
        if self.load_predictor not in PREDICTORS:
            raise ValueError(f"--load-predictor must be one of {PREDICTORS}")
        if self.ttft_target <= 0 or self.itl_target <= 0:
            raise ValueError("--ttft-target and --itl-target must be positive")
        if self.adjustment_interval <= 0:
            raise ValueError("--adjustment-interval must be positive")
        if not 0 < self.sla_headroom <= 1:
            raise ValueError("--sla-headroom must be in (0, 1]")
        if self.min_workers < 0 or self.max_workers < max(1, self.min_workers):
            raise ValueError("need 0 <= --min-workers <= --max-workers, --max-workers >= 1")
        if min(self.gpus_per_worker, self.predictor_window, self.mix_window) < 1:
            raise ValueError("--gpus-per-worker, --predictor-window, --mix-window must be >= 1")
        if self.scale_down_step < 1:
            raise ValueError("--scale-down-step must be >= 1")
        if not 0 <= self.kv_usage_down < self.kv_usage_up:
            raise ValueError("need 0 <= --kv-usage-down < --kv-usage-up")
        if not 0 <= self.queue_down < self.queue_up:
            raise ValueError("need 0 <= --queue-down < --queue-up")
