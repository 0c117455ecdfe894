"""KV cache tiers below the GPU: pinned host memory and disk (`OffloadManager`)."""

from stator.kv.offload.manager import EvictedBlock, OffloadManager, TierStats
from stator.kv.offload.policy import POLICIES, LoadPolicy

__all__ = ["POLICIES", "EvictedBlock", "LoadPolicy", "OffloadManager", "TierStats"]
