"""LoRA adapters in the native engine: PEFT adapters read into host memory
(`adapter`), copied on demand into the device's adapter slots (`slots`), applied to a
batch that mixes adapters with batched matmuls (`layer`, `kernels/lora.py`)."""

from stator.engines.native.lora.adapter import LoraAdapter, load_adapter
from stator.engines.native.lora.resolve import resolve_adapter

__all__ = ["LoraAdapter", "load_adapter", "resolve_adapter"]
