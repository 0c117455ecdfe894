"""The prompts of `POST /v1/completions`: token ids, or prompt embeddings.

`prompt` is text, texts, token ids or lists of token ids; text is tokenized here.
`prompt_embeds` (vLLM's extension) is base64 of a `torch.save`d tensor [tokens, hidden],
or a list of them. As in vLLM, the embeddings' prompts come first, then `prompt`'s; either
may be absent (an empty string counts as absent), not both. Embeddings are decoded with
the restricted loader of `stator.llm.prompt_embeds` and checked against what the model's
card says its engine accepts, so every problem is a 400 naming `prompt_embeds`.
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING

from stator.frontend import errors
from stator.frontend.openai.requests import CompletionRequest
from stator.frontend.processor.base import Prompt
from stator.llm.prompt_embeds import InvalidPromptEmbeds, PromptEmbeds, decode_prompt_embeds

if TYPE_CHECKING:
    from stator.frontend.processor.stator.processor import StatorProcessor


async def completion_prompts(body: CompletionRequest, processor: StatorProcessor) -> list[Prompt]:
    """Every prompt of the request, embeddings first; raises ApiError (400)."""
    embeds: list[Prompt] = []
    if body.prompt_embeds is not None:
        check_embeds_request(body, processor)
        payloads = (
            [body.prompt_embeds] if isinstance(body.prompt_embeds, str) else body.prompt_embeds
        )
        # torch.load of a large payload takes a while: keep it off the event loop.
        embeds = list(await asyncio.to_thread(_decode_all, payloads, processor))
    if body.prompt is None or body.prompt == "":
        if not embeds:
            raise errors.bad_request(
                "Either prompt or prompt_embeds must be given and non-empty.", param="prompt"
            )
        return embeds
    return [*embeds, *(await token_prompts(body, processor))]


def check_embeds_request(body: CompletionRequest, processor: StatorProcessor) -> None:
    card = processor.card
    if card.prompt_embeds_hidden_size <= 0:
        hint = (
            " (start its vLLM workers with --enable-prompt-embeds)" if card.engine == "vllm" else ""
        )
        raise errors.bad_request(
            f"Model `{processor.name}` does not accept prompt embeddings: its engine "
            f"({card.engine or 'unknown'}) takes token ids only{hint}.",
            param="prompt_embeds",
        )
    if body.echo:
        raise errors.bad_request("echo is not supported with prompt_embeds.", param="echo")


def _decode_all(payloads: list[str], processor: StatorProcessor) -> list[PromptEmbeds]:
    decoded = []
    hidden = processor.card.prompt_embeds_hidden_size
    for i, payload in enumerate(payloads):
        try:
            decoded.append(decode_prompt_embeds(payload, hidden, processor.context_length))
        except InvalidPromptEmbeds as exc:
            where = f"prompt_embeds[{i}]: " if len(payloads) > 1 else ""
            raise errors.bad_request(f"{where}{exc}", param="prompt_embeds") from exc
    return decoded


async def token_prompts(body: CompletionRequest, processor: StatorProcessor) -> list[Prompt]:
    """`prompt` as token ids, each checked to be non-empty and inside the vocabulary."""
    prompt, tokenizer = body.prompt, processor.tokenizer
    started = time.perf_counter()
    if isinstance(prompt, str):
        processor.check_text_length(prompt, "prompt")
        prompts = [await tokenizer.encode_async(prompt, add_special_tokens=True)]
    elif prompt and isinstance(prompt[0], str):
        for text in prompt:
            processor.check_text_length(text, "prompt")  # type: ignore[arg-type]
        prompts = [await tokenizer.encode_async(p, add_special_tokens=True) for p in prompt]  # type: ignore[arg-type]
    elif prompt and isinstance(prompt[0], int):
        prompts = [list(prompt)]  # type: ignore[arg-type]
    else:
        prompts = [list(p) for p in prompt]  # type: ignore[union-attr]
    processor.metrics.stage_timers["tokenize"].observe(time.perf_counter() - started)
    vocab = tokenizer.vocab_size
    for i, ids in enumerate(prompts):
        if not ids:
            raise errors.bad_request(f"prompt {i} is empty.", param="prompt")
        bad = next((t for t in ids if t < 0 or t >= vocab), None)
        if bad is not None:
            raise errors.bad_request(
                f"Token id {bad} in prompt {i} is out of the vocabulary (0..{vocab - 1}).",
                param="prompt",
            )
    return prompts  # type: ignore[return-value]
