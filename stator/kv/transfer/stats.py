"""Counters of one decode engine's KV pulls, for its metrics."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class TransferStats:
    transfers: int = 0
    blocks: int = 0
    bytes: int = 0
    seconds: float = 0.0
    # Requests whose prompt was computed on the decode side after all (pull failed, or
    # no room to receive it).
    fallbacks: int = 0
    last_gbps: float = 0.0
    by_kind: dict[str, int] = field(default_factory=dict)

    def record(self, result: Any) -> None:
        self.transfers += 1
        self.blocks += result.blocks
        self.bytes += result.bytes
        self.seconds += result.seconds
        self.by_kind[result.kind] = self.by_kind.get(result.kind, 0) + 1
        if result.seconds > 0:
            self.last_gbps = result.bytes / result.seconds / 1e9

    def gauges(self) -> dict[str, float]:
        out: dict[str, float] = {
            "kv_transfers_total": self.transfers,
            "kv_transfer_blocks_total": self.blocks,
            "kv_transfer_bytes_total": self.bytes,
            "kv_transfer_seconds_total": self.seconds,
            "kv_transfer_fallbacks_total": self.fallbacks,
            "kv_transfer_last_gbps": self.last_gbps,
        }
        for kind, count in self.by_kind.items():
            out[f"kv_transfers_{kind}_total"] = count
        return out
