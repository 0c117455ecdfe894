"""The engine core's gauges for the worker's /metrics (`Engine.metrics()`), read the same
way whether the core runs in the worker's process or in its own."""

from __future__ import annotations

from typing import Any


def core_metrics(core) -> dict[str, Any]:
    out: dict[str, Any] = {
        "native_kv_blocks_used": core.blocks.num_used_blocks,
        "native_kv_blocks_total": core.blocks.num_blocks,
        "kv_exports_pinned": len(core.exports),
        "kv_exports_released_total": core.exports.num_released,
        "kv_exports_expired_total": core.exports.num_expired,
        "kv_exports_released_at_pin_total": core.exports.num_released_at_pin,
        "kv_imports_in_flight": len(core.importing),
        "preemptions_total": core.scheduler.num_preemptions,
    }
    if core.specdec is not None:
        stats = core.specdec.stats
        out.update(
            native_spec_verifications=stats.steps,
            native_spec_draft_tokens=stats.drafted,
            native_spec_accepted_tokens=stats.accepted,
            native_spec_acceptance_rate=stats.acceptance_rate,
            native_spec_mean_accepted_length=stats.mean_accepted_length,
        )
    if core.offload is not None:
        out.update(core.offload.metrics())
    return out
