"""Load or recompute: bring a prefix back from a lower tier only when that is faster.

Loading n blocks costs their bytes over the measured copy bandwidth (host to device, plus
disk to host for the blocks only on disk); recomputing them costs their tokens at the
measured prefill speed. Both speeds are running averages of what this engine actually did,
so short prefixes on a fast GPU are recomputed and long ones are loaded. Until prefill has
been measured the policy loads (a load never gives a wrong answer, only a slower one).
"""

from __future__ import annotations

from dataclasses import dataclass

POLICIES = ["auto", "always", "never"]
_ALPHA = 0.2  # weight of the newest sample in the running averages
_MIN_PREFILL_TOKENS = 64  # smaller steps are mostly fixed cost: no prefill speed sample


@dataclass
class LoadPolicy:
    mode: str = "auto"
    block_bytes: int = 0
    block_size: int = 16
    host_bandwidth: float | None = None  # bytes/s, host -> device
    disk_bandwidth: float | None = None  # bytes/s, disk -> host
    seconds_per_token: float | None = None  # prefill

    def __post_init__(self) -> None:
        if self.mode not in POLICIES:
            raise ValueError(f"load policy must be one of {POLICIES}, got {self.mode!r}")

    def should_load(self, host_blocks: int, disk_blocks: int) -> bool:
        if self.mode != "auto":
            return self.mode == "always"
        return self.load_seconds(host_blocks, disk_blocks) <= self.recompute_seconds(
            host_blocks + disk_blocks
        )

    def load_seconds(self, host_blocks: int, disk_blocks: int) -> float:
        n = host_blocks + disk_blocks
        seconds = n * self.block_bytes / self.host_bandwidth if self.host_bandwidth else 0.0
        if disk_blocks and self.disk_bandwidth:
            seconds += disk_blocks * self.block_bytes / self.disk_bandwidth
        return seconds

    def recompute_seconds(self, blocks: int) -> float:
        if self.seconds_per_token is None:
            return float("inf")
        return blocks * self.block_size * self.seconds_per_token

    # -- measurements ------------------------------------------------------------------

    def observe_prefill(self, tokens: int, seconds: float) -> None:
        if tokens >= _MIN_PREFILL_TOKENS and seconds > 0:
            self.seconds_per_token = _mix(self.seconds_per_token, seconds / tokens)

    def observe_host_copy(self, nbytes: int, seconds: float) -> None:
        if nbytes > 0 and seconds > 0:
            self.host_bandwidth = _mix(self.host_bandwidth, nbytes / seconds)

    def observe_disk_read(self, nbytes: int, seconds: float) -> None:
        if nbytes > 0 and seconds > 0:
            self.disk_bandwidth = _mix(self.disk_bandwidth, nbytes / seconds)


def _mix(old: float | None, new: float) -> float:
    return new if old is None else (1 - _ALPHA) * old + _ALPHA * new
