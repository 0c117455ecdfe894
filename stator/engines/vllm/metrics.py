"""vLLM's own Prometheus metrics, read back for stator's worker registry and load reports.

vLLM's stat loggers write `vllm:*` metrics into prometheus_client's default registry of
the process that runs `AsyncLLM` (this one). The worker host serves its own registry with
stator's `model` label; `Engine.metrics()` feeds it, so each vLLM gauge and counter shows
up there as `stator_worker_engine_vllm_<name>{model=...}` (histograms as _sum and _count).
"""

from __future__ import annotations

from prometheus_client import REGISTRY, CollectorRegistry

_KEPT_SUFFIXES = ("", "_total", "_sum", "_count")


def vllm_samples(registry: CollectorRegistry = REGISTRY) -> dict[str, float]:
    """Every vLLM metric as `vllm_<name>` -> value, summed over vLLM's own labels."""
    values: dict[str, float] = {}
    for family in registry.collect():
        if not family.name.startswith("vllm:"):
            continue
        for sample in family.samples:
            suffix = sample.name[len(family.name) :]
            if suffix not in _KEPT_SUFFIXES or sample.name.endswith("_created"):
                continue
            name = "vllm_" + sample.name.removeprefix("vllm:").replace(":", "_")
            values[name] = values.get(name, 0.0) + float(sample.value)
    return values
