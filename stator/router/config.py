"""Router configuration (flags of `stator frontend` / `stator run`)."""

from __future__ import annotations

from dataclasses import dataclass

from stator.config import option
from stator.router.busy import QUEUE_POLICIES, BusyThresholds

ROUTER_MODES = ["round-robin", "random", "power-of-two", "least-loaded", "direct", "kv"]


@dataclass
class RouterConfig:
    router_mode: str = option("round-robin", "How to pick a worker", choices=ROUTER_MODES)
    # 4, not Dynamo's 1: a cached prefix saves prefill, which costs far more engine time
    # than holding the same blocks while decoding (docs/router.md, "Choosing w").
    kv_overlap_score_weight: float = option(
        4.0,
        "kv mode: weight of prefill blocks against decode blocks in the cost "
        "(higher favours cache hits and the shortest prefill queue, lower favours even KV "
        "use; 1 is Dynamo's default)",
    )
    # A lower-tier hit saves the prefill but costs a copy: on an H100 a host block comes
    # back at ~10x the speed of recomputing it, a disk block at roughly its speed
    # (docs/kv_tiers.md); these are the fractions of a GPU hit they are worth.
    kv_host_overlap_weight: float = option(
        0.75,
        "kv mode: a prompt block a worker holds in host memory (KV offload) counts as this "
        "fraction of a block cached on its GPU",
    )
    kv_disk_overlap_weight: float = option(
        0.25,
        "kv mode: a prompt block a worker holds on disk counts as this fraction of a block "
        "cached on its GPU",
    )
    router_temperature: float = option(
        0.0, "kv mode: 0 picks the lowest cost; above 0 samples with softmax over costs"
    )
    router_kv_events: bool = option(
        True,
        "kv mode: index workers' KV events (--no-router-kv-events: assume each worker holds "
        "the prompts the router sent it, for --router-ttl seconds)",
    )
    router_kv_index_jump: int = option(
        8,
        "kv mode: check every Nth prompt block in the index and scan back only where a "
        "worker dropped out (faster lookups on long prompts; misses a hole inside a "
        "stride, which engines that evict tail blocks first rarely leave). 1 checks every block",
    )
    router_ttl: float = option(
        120.0, "Approximate kv mode: seconds a routed prompt is assumed cached"
    )
    router_max_tree_size: int = option(
        2**20, "Approximate kv mode: most blocks remembered (pruned to 80% beyond)"
    )
    active_decode_blocks_threshold: float | None = option(
        None, "A worker is busy above this fraction of its KV blocks in use (none: never)"
    )
    active_prefill_tokens_threshold: int | None = option(
        None, "A worker is busy above this many prompt tokens waiting for prefill (none: never)"
    )
    router_queue_size: int = option(
        0, "Requests that may wait while every worker is busy (0: reject at once with 503)"
    )
    router_queue_policy: str = option(
        "fcfs",
        "Order of the wait queue: fcfs, or priority (EngineRequest.priority, high first)",
        choices=QUEUE_POLICIES,
    )
    router_queue_timeout: float = option(
        30.0, "Seconds a request may wait in the queue before it is rejected with 503"
    )
    migration_limit: int | None = option(
        None,
        "Times a stream may move to another worker after its worker died "
        "(none: the model card's value; 0: never)",
    )
    router_replica_sync: bool = option(
        False, "Share router-tracked load with the other frontends over the event plane"
    )
    router_replica_ttl: float = option(
        5.0,
        "With --router-replica-sync: seconds without a word from another frontend after which "
        "its bookings are dropped (it crashed or left); each frontend says it is alive every "
        "third of this",
    )
    enforce_disagg: bool = option(
        False,
        "Disaggregated serving: fail requests with 503 when no prefill worker is live (or "
        "the prefill worker fails) instead of prefilling them on a decode worker",
    )
    disagg_min_prefill_tokens: int = option(
        512,
        "Disaggregated serving: prompts whose part not cached on a decode worker is "
        "shorter than this are prefilled on the decode worker (moving their KV costs "
        "more than computing it there)",
    )
    disagg_max_prefill_queue: int = option(
        0,
        "Disaggregated serving: when every prefill worker has more than this many prompt "
        "tokens queued, prefill on the decode worker instead (0: no limit)",
    )
    router_seed: int | None = option(None, "Seed for the router's random choices (tests)")

    def busy_thresholds(self) -> BusyThresholds:
        return BusyThresholds(
            self.active_decode_blocks_threshold, self.active_prefill_tokens_threshold
        )

    def validate(self) -> None:
        if self.router_mode not in ROUTER_MODES:
            raise ValueError(f"router_mode must be one of {ROUTER_MODES}, got {self.router_mode!r}")
        if self.kv_overlap_score_weight < 0:
            raise ValueError("kv_overlap_score_weight must be >= 0")
        for name in ("kv_host_overlap_weight", "kv_disk_overlap_weight"):
            if not 0 <= getattr(self, name) <= 1:
                raise ValueError(f"{name} must be within [0, 1]")
        if self.router_temperature < 0:
            raise ValueError("router_temperature must be >= 0")
        if self.router_ttl <= 0 or self.router_max_tree_size <= 0:
            raise ValueError("router_ttl and router_max_tree_size must be positive")
        if self.router_kv_index_jump < 1:
            raise ValueError("router_kv_index_jump must be >= 1")
        if self.router_replica_ttl <= 0:
            raise ValueError("router_replica_ttl must be positive")
        if self.router_queue_size < 0:
            raise ValueError("router_queue_size must be >= 0")
        if self.disagg_min_prefill_tokens < 0 or self.disagg_max_prefill_queue < 0:
            raise ValueError("disagg_min_prefill_tokens and disagg_max_prefill_queue must be >= 0")
        if self.migration_limit is not None and self.migration_limit < 0:
            raise ValueError("migration_limit must be >= 0")
        self.busy_thresholds().validate()
