"""Simulated KV copy times: pulling a prefill worker's KV over the link (decode role),
and loading offloaded blocks back from the host and disk tiers. Both scale with the
model's KV bytes per token and shrink by the speedup ratio, as the step times do."""

from __future__ import annotations

from dataclasses import dataclass

from stator.engines.mocker.config import MockerConfig
from stator.engines.mocker.timing import PolynomialTiming, ProfileTiming, StepShape


@dataclass
class KvCopyTimes:
    config: MockerConfig
    kv_bytes_per_token: int
    model: PolynomialTiming | ProfileTiming

    def transfer_seconds(self, num_tokens: int) -> float:
        """Simulated time to pull `num_tokens` of KV from a prefill worker."""
        bandwidth = self.config.kv_transfer_bandwidth * 1e9
        if bandwidth <= 0 or self.config.speedup_ratio <= 0:
            return 0.0
        return num_tokens * self.kv_bytes_per_token / bandwidth / self.config.speedup_ratio

    def load_seconds(self, host_blocks: int, disk_blocks: int) -> float:
        """Simulated time to copy blocks back from the lower tiers (the step waits)."""
        if self.config.speedup_ratio <= 0:
            return 0.0
        block = self.kv_bytes_per_token * self.config.block_size
        seconds = 0.0
        for blocks, gbs in (
            (host_blocks, self.config.host_load_bandwidth),
            (disk_blocks, self.config.disk_load_bandwidth),
        ):
            if blocks and gbs > 0:
                seconds += blocks * block / (gbs * 1e9)
        return seconds / self.config.speedup_ratio

    def should_load(self, host_blocks: int, disk_blocks: int) -> bool:
        """Load when the copy is faster than the prefill of the same tokens would be."""
        tokens = (host_blocks + disk_blocks) * self.config.block_size
        kv_tokens = self.config.num_gpu_blocks * self.config.block_size
        prefill = self.model.prefill_ms(StepShape(tokens, 0, 0, kv_tokens)) / 1000.0
        ratio = self.config.speedup_ratio
        return self.load_seconds(host_blocks, disk_blocks) * (ratio if ratio > 0 else 1) <= prefill
