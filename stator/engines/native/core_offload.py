"""The engine core's KV offload tiers (`--kv-offloading-size`, `--disk-offload-dir`):
built from the config, and driven between scheduling and each step's kernels."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import torch

from stator.engines.native.config import ModelSpec
from stator.kv.offload import OffloadManager
from stator.kv.offload.manager import GiB


class OffloadCore:
    offload: OffloadManager | None

    def _make_offload(self, model_dir: str | Path) -> OffloadManager | None:
        cfg = self.config
        if cfg.kv_offloading_size <= 0 and not cfg.disk_offload_dir:
            return None
        if cfg.tensor_parallel_size > 1:
            raise ValueError(
                "KV offload (--kv-offloading-size) does not support tensor parallelism yet"
            )
        if not cfg.enable_prefix_caching:
            raise ValueError("KV offload needs prefix caching (blocks are found by their hash)")
        if cfg.disk_offload_dir and cfg.disk_offload_gb <= 0:
            raise ValueError("--disk-offload-dir needs --disk-offload-gb")
        pool = self.runner.kv_pool
        assert pool is not None
        return OffloadManager(
            pool,
            block_size=cfg.block_size,
            host_bytes=int(cfg.kv_offloading_size * GiB),
            disk_dir=cfg.disk_offload_dir or None,
            disk_bytes=int(cfg.disk_offload_gb * GiB),
            policy=cfg.kv_load_policy,
            layout_id=_layout_id(self.spec, Path(model_dir), cfg.load_format),
            emit=self.blocks.emit,
        )

    def _move_blocks(self) -> None:
        """Between scheduling and the step's kernels: save what the GPU tier evicted
        (before the step overwrites it), start the loads admission asked for, and give
        back the blocks of loads that have finished."""
        offload, blocks = self.offload, self.blocks
        assert offload is not None
        with torch.inference_mode():
            if blocks.evicted:
                offload.save(blocks.evicted)
                blocks.evicted = []
            for hashes, block_ids in blocks.loads:
                blocks.release(offload.load(hashes, block_ids))
            blocks.loads = []
            blocks.release(offload.poll())


def _layout_id(spec: ModelSpec, model_dir: Path, load_format: str) -> str:
    """Names the model whose KV a disk tier holds: its config and weights' files (names,
    sizes, times), so a tier is never read back into another model."""
    digest = hashlib.sha256(json.dumps(spec.raw, sort_keys=True).encode())
    digest.update(load_format.encode())
    for f in sorted(model_dir.glob("*.safetensors")):
        st = f.stat()
        digest.update(f"{f.name}:{st.st_size}:{st.st_mtime_ns}".encode())
    return digest.hexdigest()[:16]
