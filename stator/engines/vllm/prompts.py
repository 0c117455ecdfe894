"""A stator request's prompt as vLLM takes it: token ids, or prompt embeddings checked
against the model (hidden size, context) before they reach vLLM."""

from __future__ import annotations

from typing import Any

from vllm.config import ModelConfig
from vllm.inputs import EmbedsPrompt, TokensPrompt

from stator.engines.base import EngineError
from stator.llm.prompt_embeds import InvalidPromptEmbeds, embeds_tensor
from stator.protocols import EngineRequest


def vllm_prompt(
    request: EngineRequest, model_config: ModelConfig
) -> tuple[Any, list[int] | None, int]:
    """(vLLM prompt, prompt token ids or None, prompt length)."""
    if request.prompt_embeds is not None:
        if not model_config.enable_prompt_embeds:
            raise EngineError(
                "prompt embeddings need the worker started with --enable-prompt-embeds"
            )
        try:
            tensor = embeds_tensor(
                request.prompt_embeds,
                request.prompt_embeds_shape,
                request.prompt_embeds_dtype,
                model_config.get_hidden_size(),
                model_config.max_model_len,
            )
        except InvalidPromptEmbeds as exc:
            raise EngineError(f"invalid prompt_embeds: {exc}") from exc
        return EmbedsPrompt(prompt_embeds=tensor), None, int(tensor.shape[0])
    if not request.token_ids:
        raise EngineError("the request has neither token_ids nor prompt_embeds")
    return (
        TokensPrompt(prompt_token_ids=list(request.token_ids)),
        request.token_ids,
        len(request.token_ids),
    )
