"""`StatorProcessor`: stator's own text side of a model (`--processor stator`).

Chat: the model's chat template (or the Harmony renderer for GPT-OSS) and tokenizer;
completions: text or token-id prompts, or prompt embeddings (`prompts.py`). Sampling and
stop conditions come from `stator.llm.build_sampling`; outputs are detokenized and cut at
stop strings by `stator.llm.ChoiceProcessor`, and parsed by the card's reasoning and
tool-call parsers (`parsing.py`).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from typing import Any

import msgspec

from stator.frontend import errors
from stator.frontend.metrics import FrontendMetrics
from stator.frontend.openai.requests import ChatCompletionRequest, CompletionRequest
from stator.frontend.processor.base import ChoicePlan, PreparedRequest, Prompt
from stator.frontend.processor.choices import fan_out
from stator.frontend.processor.stator.parsing import ModelParsing
from stator.frontend.processor.stator.prompts import completion_prompts
from stator.frontend.routing.hints import routing_hints
from stator.llm import (
    ChoiceProcessor,
    InvalidParam,
    ModelFiles,
    TemplateRenderError,
    build_sampling,
)
from stator.protocols import EngineRequest, GuidedDecoding, ModelCard, SamplingOptions
from stator.structured_output import InvalidGrammar, validate


class StatorProcessor:
    kind = "stator"

    def __init__(self, card: ModelCard, files: ModelFiles, metrics: FrontendMetrics) -> None:
        self.card = card
        self.name = card.name
        # A LoRA adapter's card: requests name the adapter (KV hashes and routing use it).
        self.lora_name = card.name if card.base_model else None
        self.files = files
        self.tokenizer = files.tokenizer
        self.template = files.chat_template
        self.context_length = files.context_length or card.context_length
        self.metrics = metrics
        self.eos_token_ids = list(files.eos_token_ids)
        # Unknown parser names and a Harmony model without Harmony tokens fail here, loudly.
        self.parsing = ModelParsing.from_card(card, files.tokenizer.inner)
        self.has_reasoning = self.parsing.has_reasoning

    @classmethod
    async def create(cls, card: ModelCard, metrics: FrontendMetrics) -> StatorProcessor:
        # Reading and parsing tokenizer.json takes tens of ms: keep it off the event loop.
        files = await asyncio.to_thread(ModelFiles.from_card, card)
        return cls(card, files, metrics)

    # -- the two request kinds -------------------------------------------------------

    async def chat(self, body: ChatCompletionRequest, request_id: str) -> PreparedRequest:
        prompt = await self.chat_prompt(body)
        choices = self.plan_choices(body, [prompt], request_id)
        for choice in choices:
            choice.parser = self.parsing.for_request(
                self.tokenizer.inner, body.tools, body.tool_choice, body.chat_template_kwargs
            )
        return PreparedRequest([prompt], choices)

    async def completion(self, body: CompletionRequest, request_id: str) -> PreparedRequest:
        prompts = await completion_prompts(body, self)
        return PreparedRequest(prompts, self.plan_choices(body, prompts, request_id))

    def decode_prompt(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=False)

    # -- prompts ---------------------------------------------------------------------

    async def chat_prompt(self, body: ChatCompletionRequest) -> list[int]:
        self.parsing.check_tool_choice(body.tools, body.tool_choice)
        if self.parsing.harmony is not None:
            return self._harmony_prompt(body)
        if self.template is None:
            raise errors.bad_request(
                f"Model `{self.name}` has no chat template; use /v1/completions.",
                param="messages",
            )
        messages = self._template_messages(body)
        started = time.perf_counter()
        try:
            text = self.template.render(
                messages,
                tools=body.tools,
                add_generation_prompt=body.add_generation_prompt
                and not body.continue_final_message,
                continue_final_message=body.continue_final_message,
                **(body.chat_template_kwargs or {}),
            )
        except TemplateRenderError as exc:
            raise errors.bad_request(str(exc), param="messages") from exc
        rendered = time.perf_counter()
        self.check_text_length(text, "messages")
        ids = await self.tokenizer.encode_async(text, add_special_tokens=False)
        self.metrics.stage_timers["template"].observe(rendered - started)
        self.metrics.stage_timers["tokenize"].observe(time.perf_counter() - rendered)
        return ids

    def check_text_length(self, text: str, param: str) -> None:
        """A 400 for text too long to fit the context whatever it tokenizes to, before
        paying to tokenize it."""
        limit = self.context_length * self.tokenizer.max_token_chars
        if len(text) > limit:
            raise errors.bad_request(
                f"This model's maximum context length is {self.context_length} tokens; the "
                f"prompt's {len(text)} characters cannot fit in it.",
                param=param,
                code="context_length_exceeded",
            )

    @staticmethod
    def _template_messages(body: ChatCompletionRequest) -> list[dict[str, Any]]:
        messages = []
        for i, message in enumerate(body.messages):
            try:
                messages.append(message.as_template_dict())
            except ValueError as exc:
                raise errors.bad_request(str(exc), param=f"messages[{i}].content") from exc
        return messages

    def _harmony_prompt(self, body: ChatCompletionRequest) -> list[int]:
        """GPT-OSS: the conversation rendered as Harmony tokens (its chat template is not
        used: the renderer is exact and knows reasoning effort and tools)."""
        started = time.perf_counter()
        # Content parts stay parts here: Harmony encodes each on its own (chat_to_harmony).
        messages = [message.model_dump(exclude_none=True) for message in body.messages]
        ids = self.parsing.harmony_prompt(messages, body.tools, body.reasoning_effort)
        self.metrics.stage_timers["template"].observe(time.perf_counter() - started)
        return ids

    # -- engine requests -------------------------------------------------------------

    def plan_choices(
        self,
        body: ChatCompletionRequest | CompletionRequest,
        prompts: Sequence[Prompt],
        request_id: str,
    ) -> list[ChoicePlan]:
        """One `ChoicePlan` per (prompt, choice), indexed `prompt * n + choice`."""
        fields = body.model_dump(exclude_unset=True)
        chat = isinstance(body, ChatCompletionRequest)
        skip_special = (
            self.parsing.skip_special_tokens(body.skip_special_tokens, body.tools, body.tool_choice)
            if chat
            else body.skip_special_tokens
        )
        routing, priority = routing_hints(body)
        keep_token_deltas = self.parsing.harmony is not None
        plans: list[ChoicePlan] = []
        for p, prompt in enumerate(prompts):
            ids, embeds = (prompt, None) if isinstance(prompt, list) else ([], prompt)
            try:
                # Per prompt: the default max_tokens and the context check depend on its
                # length.
                sampling, stop, stop_strings = build_sampling(
                    fields,
                    generation_config=self.files.generation_config,
                    eos_token_ids=self.eos_token_ids,
                    vocab_size=self.tokenizer.vocab_size,
                    prompt_tokens=len(ids) if embeds is None else embeds.num_tokens,
                    context_length=self.context_length,
                    api="chat" if chat else "completions",
                )
            except InvalidParam as exc:
                raise errors.bad_request(exc.message, param=exc.param) from exc
            if chat:
                sampling = self._constrain_tool_choice(body, sampling)  # type: ignore[arg-type]
            if sampling.guided_decoding is not None and not self.card.structured_output:
                raise errors.bad_request(
                    f"Model `{self.name}` cannot constrain its output: its workers "
                    f"({self.card.engine or 'this engine'}) do not support structured output.",
                    param="response_format",
                )
            if self.parsing.harmony is not None and chat:
                # <|return|> ends the answer, <|call|> a tool call: both end generation.
                # Visible, even where generation_config lists them as EOS: the parser
                # needs them to close the last message.
                harmony_stops = self.parsing.stop_token_ids
                extra = [t for t in harmony_stops if t not in stop.stop_token_ids]
                stop = msgspec.structs.replace(
                    stop,
                    stop_token_ids=[*stop.stop_token_ids, *extra],
                    stop_token_ids_hidden=[
                        t for t in stop.stop_token_ids_hidden if t not in harmony_stops
                    ],
                )
            request = EngineRequest(
                request_id=request_id if p == 0 else f"{request_id}-{p * body.n}",
                model=self.name,
                lora_name=self.lora_name,
                token_ids=ids,
                prompt_embeds=None if embeds is None else embeds.data,
                prompt_embeds_shape=None if embeds is None else embeds.shape,
                prompt_embeds_dtype=None if embeds is None else embeds.dtype,
                sampling=sampling,
                stop=stop,
                priority=priority,
                routing=routing,
            )
            for c, choice in enumerate(fan_out(request, request_id, p, body.n)):
                output = ChoiceProcessor(
                    self.tokenizer,
                    stop_strings,
                    skip_special,
                    ids,
                    hidden_stop_token_ids=self.eos_token_ids,
                )
                plans.append(
                    ChoicePlan(p * body.n + c, choice, output, keep_token_deltas=keep_token_deltas)
                )
        return plans

    def _constrain_tool_choice(
        self, body: ChatCompletionRequest, sampling: SamplingOptions
    ) -> SamplingOptions:
        """A required or named tool choice becomes a JSON-schema constraint (when the
        workers can enforce one), so the model cannot answer without the call."""
        schema = self.parsing.forced_tool_schema(body.tools, body.tool_choice)
        if schema is None:
            return sampling
        if sampling.guided_decoding is not None:
            raise errors.bad_request(
                "A required or named tool_choice cannot be combined with another "
                "structured-output constraint (response_format, guided_*).",
                param="tool_choice",
            )
        try:
            validate(GuidedDecoding(json_schema=schema), "tools")
        except InvalidGrammar as exc:
            raise errors.bad_request(exc.message, param="tools") from exc
        return msgspec.structs.replace(sampling, guided_decoding=GuidedDecoding(json_schema=schema))
