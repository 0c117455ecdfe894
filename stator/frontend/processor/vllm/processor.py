"""`VllmProcessor`: a model's text side through vLLM's own classes (`--processor vllm`).

Chat: stator's validated body becomes vLLM's `ChatCompletionRequest`, which vLLM's
`OnlineRenderer.render_chat` renders and tokenizes (its chat template handling, Harmony for
GPT-OSS, its tool-choice checks and its parsers' `adjust_request`); `to_sampling_params`
with `get_max_tokens` gives the sampling, as `vllm serve` computes them. Completions: vLLM's
`CompletionRequest` and renderer likewise. Outputs go through `outputs.py`. vLLM's errors
become 400s naming the field.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

from pydantic import ValidationError

from stator.frontend import errors
from stator.frontend.metrics import FrontendMetrics
from stator.frontend.openai.requests import ChatCompletionRequest, CompletionRequest
from stator.frontend.processor.base import ChoicePlan, PreparedRequest
from stator.frontend.processor.choices import fan_out
from stator.frontend.processor.vllm import require_vllm
from stator.frontend.processor.vllm.model import VllmModel
from stator.frontend.processor.vllm.outputs import VllmChoiceParser, VllmOutput
from stator.frontend.processor.vllm.sampling import Unsupported, map_sampling
from stator.frontend.routing.hints import routing_hints
from stator.protocols import EngineRequest, ModelCard

# stator's own request fields that vLLM's request models do not take.
_STATOR_ONLY = {"nvext"}


def client_errors() -> tuple[type[BaseException], ...]:
    """What vLLM's renderer and request models raise for a bad request (a 400 here)."""
    import jinja2
    from vllm.exceptions import VLLMClientError

    return (ValueError, TypeError, KeyError, VLLMClientError, jinja2.TemplateError)


def bad_request(exc: BaseException, param: str | None = None) -> errors.ApiError:
    return errors.bad_request(str(exc), param=getattr(exc, "parameter", None) or param)


def vllm_seed(seed: int | None, index: int) -> int | None:
    """Choice `index`'s seed as vLLM's parallel sampling derives it."""
    return None if seed is None else seed + index


class VllmProcessor:
    kind = "vllm"

    def __init__(self, card: ModelCard, model: VllmModel, metrics: FrontendMetrics) -> None:
        self.card = card
        self.name = card.name
        self.lora_name = card.name if card.base_model else None
        self.model = model
        self.tokenizer = model.tokenizer
        self.metrics = metrics
        self.has_reasoning = model.reasoning_parser is not None or model.harmony

    @classmethod
    async def create(cls, card: ModelCard, metrics: FrontendMetrics) -> VllmProcessor:
        require_vllm()
        model = await asyncio.to_thread(VllmModel, card)
        return cls(card, model, metrics)

    # -- chat ------------------------------------------------------------------------

    async def chat(self, body: ChatCompletionRequest, request_id: str) -> PreparedRequest:
        from vllm.entrypoints.openai.chat_completion.protocol import (
            ChatCompletionRequest as VllmChatRequest,
        )

        request = self._vllm_request(VllmChatRequest, body)
        started = time.perf_counter()
        try:
            rendered = await self.model.online.render_chat(request)
        except client_errors() as exc:
            raise bad_request(exc, "messages") from exc
        self._raise_error_response(rendered)
        _conversation, inputs = rendered
        prompt = list(inputs[0]["prompt_token_ids"])
        self.metrics.stage_timers["template"].observe(time.perf_counter() - started)
        max_tokens = self._max_tokens(
            request.max_completion_tokens
            if request.max_completion_tokens is not None
            else request.max_tokens,
            len(prompt),
            request.truncate_prompt_tokens,
        )
        params = self._sampling_params(request, max_tokens)
        template_kwargs = self.model.online.effective_chat_template_kwargs(request)
        plans = self._plans(body, prompt, params, request_id, 0)
        calls_wanted = bool(request.tools) and request.tool_choice != "none"
        for plan in plans:
            parser = self.model.new_parser(request.tools, template_kwargs)
            if parser is not None:
                plan.parser = VllmChoiceParser(
                    parser,
                    request,
                    prompt,
                    stream=body.stream,
                    auto=self.model.enable_auto_tools and calls_wanted,
                )
                # vLLM's parsers read token ids too (Harmony's only those).
                plan.keep_token_deltas = True
        return PreparedRequest([prompt], plans)

    # -- completions -----------------------------------------------------------------

    async def completion(self, body: CompletionRequest, request_id: str) -> PreparedRequest:
        from vllm.entrypoints.openai.completion.protocol import (
            CompletionRequest as VllmCompletionRequest,
        )

        if body.prompt_embeds is not None:
            raise errors.bad_request(
                "prompt_embeds is not supported with --processor vllm.", param="prompt_embeds"
            )
        request = self._vllm_request(VllmCompletionRequest, body)
        started = time.perf_counter()
        try:
            rendered = await self.model.online.render_completion(request)
        except client_errors() as exc:
            raise bad_request(exc, "prompt") from exc
        self._raise_error_response(rendered)
        prompts = [list(engine_input["prompt_token_ids"]) for engine_input in rendered]
        self.metrics.stage_timers["tokenize"].observe(time.perf_counter() - started)
        plans: list[ChoicePlan] = []
        for p, prompt in enumerate(prompts):
            max_tokens = self._max_tokens(
                request.max_tokens, len(prompt), request.truncate_prompt_tokens
            )
            params = self._sampling_params(request, max_tokens)
            plans += self._plans(body, prompt, params, request_id, p)
        return PreparedRequest(prompts, plans)

    def decode_prompt(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=False)

    # -- shared ----------------------------------------------------------------------

    @staticmethod
    def _vllm_request(model: type, body: Any) -> Any:
        """vLLM's request model of the client's body (stator's model validated it first;
        vLLM's sees every field, those stator's drops included). A body built in the
        frontend (the Responses API's chat request) has no raw form: its fields."""
        if body._raw is not None:
            fields = json.loads(body._raw)
            for name in _STATOR_ONLY:
                fields.pop(name, None)
        else:
            fields = body.model_dump(exclude_unset=True, exclude=_STATOR_ONLY)
        try:
            return model(**fields)
        except ValidationError as exc:
            raise errors.validation_error(exc.errors()) from None
        except client_errors() as exc:
            raise bad_request(exc) from exc

    @staticmethod
    def _raise_error_response(rendered: Any) -> None:
        """vLLM's renderer answers some bad requests with its ErrorResponse."""
        error = getattr(rendered, "error", None)
        if error is not None:
            raise errors.bad_request(error.message, param=getattr(error, "param", None))

    def _max_tokens(self, requested: int | None, prompt_tokens: int, truncate: Any) -> int:
        from vllm.entrypoints.serve.utils.api_utils import get_max_tokens

        if truncate is not None:
            raise errors.bad_request(
                "truncate_prompt_tokens is not supported with --processor vllm.",
                param="truncate_prompt_tokens",
            )
        try:
            return get_max_tokens(
                self.model.max_model_len,
                requested,
                prompt_tokens,
                self.model.default_sampling_params,
                self.model.override_max_tokens,
            )
        except ValueError as exc:
            raise errors.bad_request(
                str(exc), param="messages", code="context_length_exceeded"
            ) from exc

    def _sampling_params(self, request: Any, max_tokens: int) -> Any:
        if getattr(request, "use_beam_search", False):
            raise errors.bad_request(
                "use_beam_search is not supported with --processor vllm.",
                param="use_beam_search",
            )
        try:
            return request.to_sampling_params(max_tokens, self.model.default_sampling_params)
        except client_errors() as exc:
            raise bad_request(exc) from exc

    def _plans(
        self, body: Any, prompt: list[int], params: Any, request_id: str, prompt_index: int
    ) -> list[ChoicePlan]:
        try:
            sampling, stop = map_sampling(params, self.model.eos_token_ids)
        except Unsupported as exc:
            raise errors.bad_request(str(exc), param=exc.param) from exc
        if sampling.guided_decoding is not None and not self.card.structured_output:
            raise errors.bad_request(
                f"Model `{self.name}` cannot constrain its output: its workers "
                f"({self.card.engine or 'this engine'}) do not support structured output.",
                param="response_format",
            )
        routing, priority = routing_hints(body)
        n = params.n
        request = EngineRequest(
            request_id=request_id if prompt_index == 0 else f"{request_id}-{prompt_index * n}",
            model=self.name,
            lora_name=self.lora_name,
            token_ids=prompt,
            sampling=sampling,
            stop=stop,
            priority=priority,
            routing=routing,
        )
        plans = []
        for c, choice in enumerate(fan_out(request, request_id, prompt_index, n, vllm_seed)):
            output = VllmOutput(
                self.tokenizer, params, prompt, choice.request_id, list(params.stop_token_ids or ())
            )
            plans.append(ChoicePlan(prompt_index * n + c, choice, output))
        return plans
