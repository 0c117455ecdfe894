"""The checks the mocker makes on a request's own shape before taking it (the engine
adds its state's: dead, not started, duplicate id). Pure: a request and the limits in,
the max_tokens it will run with out, or an `EngineError` (a 400 at the HTTP edge)."""

from __future__ import annotations

from stator.engines.base import EngineError
from stator.engines.mocker.config import MockerConfig
from stator.protocols import EngineRequest


def admitted_max_tokens(
    request: EngineRequest,
    config: MockerConfig,
    context_length: int,
    role: str,
    kv_capacity_tokens: int,
) -> int:
    if request.prompt_embeds is not None:
        raise EngineError("the mocker does not accept prompt embeddings")
    if request.sampling.guided_decoding is not None:
        # Random tokens cannot honour a grammar: refuse rather than pretend (a 400).
        raise EngineError("the mocker cannot do guided decoding (response_format, guided_*)")
    if request.lora_name:
        raise EngineError(f"the mocker serves no LoRA adapters (asked for {request.lora_name!r})")
    n = len(request.token_ids)
    if n == 0:
        raise EngineError("empty prompt")
    if n >= context_length:
        raise EngineError(f"prompt has {n} tokens; the context length is {context_length}")
    max_tokens = request.stop.max_tokens
    if max_tokens is None:
        max_tokens = context_length - n
    elif max_tokens < 1:
        raise EngineError(f"max_tokens must be at least 1, got {max_tokens}")
    if role == "prefill":
        max_tokens = 1
    budget = config.max_num_batched_tokens
    if not config.enable_chunked_prefill and n + max_tokens > budget:
        # Without chunking a sequence (and its recompute after preemption) must fit in
        # one step, or it would wait forever.
        raise EngineError(
            f"prompt ({n}) + max_tokens ({max_tokens}) exceeds --max-num-batched-tokens "
            f"({budget}) and chunked prefill is off"
        )
    if n + max_tokens > kv_capacity_tokens:
        raise EngineError(
            f"prompt ({n}) + max_tokens ({max_tokens}) exceeds the KV cache "
            f"({kv_capacity_tokens} tokens)"
        )
    return max_tokens
