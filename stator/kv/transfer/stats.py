"""Counters of one decode engine's KV pulls, for its metrics."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

# Pulls that begin after at least this long with none in flight open a new window: the
# span of a burst of pulls, first start to last end, is last_end - window_start.
WINDOW_GAP_S = 0.25


@dataclass
class TransferStats:
    transfers: int = 0
    blocks: int = 0
    bytes: int = 0
    seconds: float = 0.0
    copy_seconds: float = 0.0
    # Requests whose prompt was computed on the decode side after all (pull failed, or
    # no room to receive it).
    fallbacks: int = 0
    last_gbps: float = 0.0
    by_kind: dict[str, int] = field(default_factory=dict)
    phases: dict[str, float] = field(default_factory=dict)  # PullResult.phases, summed
    # Time with at least one pull in flight: bytes / busy seconds is the rate a decode
    # worker sees when pulls overlap (a burst of prompts prefilled together).
    busy_seconds: float = 0.0
    # Copy launches the pulls went in (a pull coalesced with 3 others counts 1/4): pulls
    # per batch = transfers / copy_batches.
    copy_batches: float = 0.0
    in_flight: int = 0
    # Wall-clock (time.time()) start of the current window of pulls and end of the last
    # pull: bytes over (last_end - window_start) is a burst's rate with the gaps between
    # its pulls counted, where busy time leaves them out.
    window_start: float = 0.0
    last_end: float = 0.0
    _busy_since: float = 0.0

    def begin(self) -> None:
        if self.in_flight == 0:
            self._busy_since = time.perf_counter()
            now = time.time()
            if now - self.last_end >= WINDOW_GAP_S:
                self.window_start = now
        self.in_flight += 1

    def end(self) -> None:
        self.in_flight -= 1
        if self.in_flight == 0:
            self.busy_seconds += time.perf_counter() - self._busy_since
        self.last_end = time.time()

    def record(self, result: Any) -> None:
        self.transfers += 1
        self.blocks += result.blocks
        self.bytes += result.bytes
        self.seconds += result.seconds
        self.copy_seconds += result.copy_seconds
        self.by_kind[result.kind] = self.by_kind.get(result.kind, 0) + 1
        self.copy_batches += 1 / max(1, result.batched)
        for name, seconds in result.phases.items():
            self.phases[name] = self.phases.get(name, 0.0) + seconds
        if result.seconds > 0:
            self.last_gbps = result.bytes / result.seconds / 1e9

    def gauges(self) -> dict[str, float]:
        out: dict[str, float] = {
            "kv_transfers_total": self.transfers,
            "kv_transfer_blocks_total": self.blocks,
            "kv_transfer_bytes_total": self.bytes,
            "kv_transfer_seconds_total": self.seconds,
            "kv_transfer_copy_seconds_total": self.copy_seconds,
            "kv_transfer_busy_seconds_total": self.busy_seconds,
            "kv_transfer_copy_batches_total": self.copy_batches,
            "kv_transfer_window_start_time": self.window_start,
            "kv_transfer_last_end_time": self.last_end,
            "kv_transfer_fallbacks_total": self.fallbacks,
            "kv_transfer_last_gbps": self.last_gbps,
        }
        for kind, count in self.by_kind.items():
            out[f"kv_transfers_{kind}_total"] = count
        for name, seconds in self.phases.items():
            out[f"kv_transfer_{name}_seconds_total"] = seconds
        return out
