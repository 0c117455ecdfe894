"""Qwen3: a Llama decoder with an RMSNorm over each head of q and k before RoPE."""

from __future__ import annotations

from stator.engines.native.models.llama import LlamaForCausalLM
from stator.engines.native.models.registry import register


@register("Qwen3ForCausalLM")
class Qwen3ForCausalLM(LlamaForCausalLM):
    qk_norm = True
