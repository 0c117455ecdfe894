"""Qwen2: a Llama decoder with biases on the q, k and v projections (not on o)."""

from __future__ import annotations

from stator.engines.native.models.llama import LlamaForCausalLM
from stator.engines.native.models.registry import register


@register("Qwen2ForCausalLM")
class Qwen2ForCausalLM(LlamaForCausalLM):
    qkv_bias = True
    o_bias = False
