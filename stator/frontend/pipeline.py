"""`ModelPipeline`: one model's path from an OpenAI request to engine requests and back.

preprocess (template, tokenize, sampling mapping, context check) -> `EngineRequest` per
choice -> `Router.generate` -> `ChoiceProcessor` (detokenize, stop strings) -> `Delta`s.
The HTTP shapes (chunks, responses) are built by `chat.py` / `completions.py`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import AsyncIterator, Callable, Collection, Sequence
from typing import Any

import msgspec

from stator.frontend import errors
from stator.frontend.metrics import FrontendMetrics
from stator.frontend.openai_models import ChatCompletionRequest, CompletionRequest
from stator.frontend.parsing import ModelParsing
from stator.frontend.routing_hints import WORKER_HEADER, target_worker_var, targets_var
from stator.llm import (
    ChoiceProcessor,
    Delta,
    InvalidParam,
    ModelFiles,
    TemplateRenderError,
    build_sampling,
)
from stator.llm.prompt_embeds import PromptEmbeds
from stator.protocols import AdminResponse, EngineOutput, EngineRequest, ModelCard, RoutingHints
from stator.router import BadRouting, Overloaded, Router, RouterConfig
from stator.router.disagg import DisaggRouter
from stator.runtime import Client, Migratable, NoInstances, RemoteError, Runtime
from stator.runtime.names import PREFILL_COMPONENT, EndpointName

log = logging.getLogger(__name__)

_SEED_STEP = 0x9E3779B97F4A7C15  # golden-ratio step: choice seeds far apart, reproducible
_SEED_MASK = (1 << 63) - 1


def choice_seed(seed: int | None, index: int) -> int | None:
    """Seed of choice `index` of a request seeded with `seed` (choice 0 keeps it)."""
    if seed is None or index == 0:
        return seed
    return (seed + index * _SEED_STEP) & _SEED_MASK


class EngineFailed(Exception):
    """The worker reported an error for this choice; `code` is its
    `EngineOutput.error_code` (`INVALID_REQUEST`: the engine refused the request)."""

    def __init__(self, message: str, code: str | None = None) -> None:
        super().__init__(message)
        self.code = code


class ChoiceStream:
    """One choice of a response: an engine stream run through the postprocessor.

    `prime()` waits for the first delta so routing failures (no worker, overloaded) become
    HTTP errors before a streaming response has started. Closing it closes the engine
    stream, which cancels the request on the worker.
    """

    def __init__(
        self, pipeline: ModelPipeline, index: int, request: EngineRequest, processor: Any
    ) -> None:
        self.pipeline = pipeline
        self.index = index
        self.request = request
        self.processor = processor
        shape = request.prompt_embeds_shape
        self.prompt_tokens = len(request.token_ids) if shape is None else shape[0]
        self.detokenize_seconds = 0.0
        self._outputs: AsyncIterator[EngineOutput] = pipeline.generate(request)
        self._first: Delta | None = None
        self._started = False
        self._done = False
        # Harmony is parsed on token ids: deltas whose tokens decode to no text (its
        # special tokens) must still come through.
        self._keep_token_deltas = pipeline.parsing.harmony is not None

    async def prime(self) -> None:
        started = time.perf_counter()
        try:
            self._first = await self._next_delta()
        except NoInstances as exc:
            raise errors.no_workers(self.request.model) from exc
        except Overloaded as exc:
            raise errors.overloaded(str(exc), exc.retry_after) from exc
        except BadRouting as exc:
            raise errors.bad_request(str(exc), param=WORKER_HEADER) from exc
        except Migratable as exc:
            raise errors.no_workers(self.request.model) from exc
        except EngineFailed as exc:
            raise errors.engine_failed_from(exc) from exc
        finally:
            # Time to route and get the first output back (prefill included).
            self.pipeline.metrics.stage_timers["route"].observe(time.perf_counter() - started)

    async def _next_delta(self) -> Delta:
        """The next delta with something in it (text, tokens or a finish reason)."""
        try:
            return await self._read_delta()
        except RemoteError as exc:
            raise EngineFailed(str(exc)) from exc
        except Migratable as exc:
            if not self._started:
                raise  # before any output: no worker could take it (503 in `prime`)
            raise EngineFailed(f"the worker was lost mid-stream: {exc}") from exc

    async def _read_delta(self) -> Delta:
        async for output in self._outputs:
            self._started = True
            if output.finish_reason == "error":
                raise EngineFailed(output.error or "engine error", output.error_code)
            started = time.perf_counter()
            delta = self.processor.process(output)
            self.detokenize_seconds += time.perf_counter() - started
            if delta.text or delta.finish_reason or delta.logprobs:
                return delta
            if self._keep_token_deltas and delta.token_ids:
                return delta
        raise EngineFailed("the engine stream ended without a finish reason")

    @property
    def completion_tokens(self) -> int:
        return self.processor.completion_tokens

    @property
    def cached_tokens(self) -> int:
        return self.processor.cached_tokens

    async def deltas(self) -> AsyncIterator[Delta]:
        """Every delta of this choice, the primed one first; ends at the finish."""
        try:
            delta = self._first if self._first is not None else await self._next_delta()
            self._first = None
            while True:
                yield delta
                if delta.finish_reason is not None:
                    return
                delta = await self._next_delta()
        finally:
            await self.aclose()

    async def aclose(self) -> None:
        if self._done:
            return
        self._done = True
        # Closing the generator cancels the request on the worker (a stop string matched
        # early, the client went away, or a sibling choice failed).
        await self._outputs.aclose()
        self.pipeline.metrics.stage_timers["detokenize"].observe(self.detokenize_seconds)


class ModelPipeline:
    def __init__(
        self,
        card: ModelCard,
        files: ModelFiles,
        client: Client,
        router: Router,
        metrics: FrontendMetrics,
        disagg: DisaggRouter | None = None,
    ) -> None:
        self.card = card
        self.name = card.name
        # A LoRA adapter's card: requests name the adapter (KV hashes and routing use it).
        self.lora_name = card.name if card.base_model else None
        self.files = files
        self.tokenizer = files.tokenizer
        self.template = files.chat_template
        self.context_length = files.context_length or card.context_length
        self.client = client
        # The decode (or aggregated) workers' router; `disagg` adds the prefill workers'.
        self.router = router
        self.disagg = disagg or DisaggRouter(router, None, router.config)
        self.metrics = metrics
        self.model_metrics = metrics.for_model(self.name)
        self.eos_token_ids = list(files.eos_token_ids)
        # Unknown parser names and a Harmony model without Harmony tokens fail here, loudly.
        self.parsing = ModelParsing.from_card(card, files.tokenizer.inner)

    @classmethod
    async def create(
        cls,
        runtime: Runtime,
        card: ModelCard,
        endpoint: EndpointName,
        router_config: RouterConfig,
        metrics: FrontendMetrics,
        allowed_workers: Callable[[], Collection[int]] | None = None,
        router: Any = None,
    ) -> ModelPipeline:
        """`allowed_workers`: the only workers to route to (those that publish this card,
        for a LoRA adapter that not every worker of the endpoint has loaded). `router`: a
        router-shaped object to use instead of the routers over `endpoint` and its prefill
        workers (the global router's view of the model: `generate`, busy thresholds,
        `client`, `close`)."""
        # Reading and parsing tokenizer.json takes tens of ms: keep it off the event loop.
        files = await asyncio.to_thread(ModelFiles.from_card, card)
        if router is not None:
            return cls(card, files, router.client, router, metrics, disagg=router)
        client = await runtime.client(endpoint, EngineOutput)
        router = Router(
            runtime,
            client,
            card,
            router_config,
            registry=metrics.registry,
            allowed_workers=allowed_workers,
        )
        # Prefill workers of this namespace, wherever the model's own workers serve.
        prefill_endpoint = EndpointName(endpoint.namespace, PREFILL_COMPONENT, endpoint.endpoint)
        prefill_client = await runtime.client(prefill_endpoint, EngineOutput)
        prefill = Router(
            runtime,
            prefill_client,
            msgspec.structs.replace(card, role="prefill"),
            dataclasses.replace(router_config, router_replica_sync=False),
            registry=metrics.registry,
        )
        admin = await runtime.client(prefill_endpoint.sibling("admin"), AdminResponse)
        disagg = DisaggRouter(router, prefill, router_config, prefill_admin=admin)
        await disagg.start()
        return cls(card, files, client, router, metrics, disagg)

    def generate(self, request: EngineRequest) -> AsyncIterator[EngineOutput]:
        """The request's outputs from the model's workers (prefill and decode ones when
        the model has both)."""
        return self.disagg.generate(request)

    async def close(self) -> None:
        await self.disagg.close()
        await self.client.close()
        for client in (self.disagg.prefill, self.disagg.prefill_admin):
            if client is not None:
                await (client.client if isinstance(client, Router) else client).close()

    # -- preprocessing ---------------------------------------------------------------

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

    def decode_prompt(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=False)

    # -- engine requests -------------------------------------------------------------

    def open_choices(
        self,
        body: ChatCompletionRequest | CompletionRequest,
        prompts: Sequence[list[int] | PromptEmbeds],
        request_id: str,
    ) -> list[ChoiceStream]:
        """One `ChoiceStream` per (prompt, choice), indexed `prompt * n + choice`. A prompt
        is token ids, or embeddings sent in their place (completions only)."""
        fields = body.model_dump(exclude_unset=True)
        api = "chat" if isinstance(body, ChatCompletionRequest) else "completions"
        skip_special = (
            self.parsing.skip_special_tokens(body.skip_special_tokens, body.tools, body.tool_choice)
            if isinstance(body, ChatCompletionRequest)
            else body.skip_special_tokens
        )
        routing, priority = routing_hints(body)
        streams: list[ChoiceStream] = []
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
                    api=api,
                )
            except InvalidParam as exc:
                raise errors.bad_request(exc.message, param=exc.param) from exc
            if self.parsing.harmony is not None and api == "chat":
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
            # Each engine request is one choice; `n` is fanned out here.
            sampling = msgspec.structs.replace(sampling, n=1)
            for c in range(body.n):
                index = p * body.n + c
                choice_sampling = (
                    msgspec.structs.replace(sampling, seed=choice_seed(sampling.seed, c))
                    if c
                    else sampling
                )
                request = EngineRequest(
                    request_id=request_id if index == 0 else f"{request_id}-{index}",
                    model=self.name,
                    lora_name=self.lora_name,
                    token_ids=ids,
                    prompt_embeds=None if embeds is None else embeds.data,
                    prompt_embeds_shape=None if embeds is None else embeds.shape,
                    prompt_embeds_dtype=None if embeds is None else embeds.dtype,
                    sampling=choice_sampling,
                    stop=stop,
                    priority=priority,
                    routing=routing,
                )
                processor = ChoiceProcessor(
                    self.tokenizer,
                    stop_strings,
                    skip_special,
                    ids,
                    hidden_stop_token_ids=self.eos_token_ids,
                )
                streams.append(ChoiceStream(self, index, request, processor))
        return streams


def routing_hints(
    body: ChatCompletionRequest | CompletionRequest,
) -> tuple[RoutingHints | None, int]:
    """(routing hints, priority) from the headers (context variables) and `nvext`."""
    target = target_worker_var.get()
    ttft, itl = targets_var.get()
    priority = 0
    nvext = body.nvext
    if nvext is not None:
        ttft = nvext.ttft_target or ttft
        itl = nvext.itl_target or itl
        hinted = nvext.agent_hints.priority if nvext.agent_hints else None
        priority = nvext.priority if nvext.priority is not None else (hinted or 0)
    if target is None and ttft is None and itl is None:
        return None, priority
    hints = RoutingHints(target_worker_id=target, ttft_target_ms=ttft, itl_target_ms=itl)
    return hints, priority


async def prime_all(streams: list[ChoiceStream]) -> None:
    """Prime every choice concurrently; on any failure close them all and re-raise."""
    try:
        if len(streams) == 1:
            await streams[0].prime()
        else:
            await asyncio.gather(*(s.prime() for s in streams))
    except BaseException:
        await close_all(streams)
        raise


async def close_all(streams: list[ChoiceStream]) -> None:
    for stream in streams:
        try:
            await stream.aclose()
        except Exception:
            log.exception("closing choice %d failed", stream.index)


async def merged_deltas(streams: list[ChoiceStream]) -> AsyncIterator[tuple[int, Delta]]:
    """(choice index, delta) from every choice as they come. One choice is iterated
    directly: no task or queue on the common path."""
    if len(streams) == 1:
        stream = streams[0]
        async for delta in stream.deltas():
            yield stream.index, delta
        return
    queue: asyncio.Queue[tuple[int, Delta] | BaseException | None] = asyncio.Queue()

    async def pump(stream: ChoiceStream) -> None:
        try:
            async for delta in stream.deltas():
                queue.put_nowait((stream.index, delta))
            queue.put_nowait(None)
        except Exception as exc:
            queue.put_nowait(exc)

    tasks = [asyncio.create_task(pump(s)) for s in streams]
    try:
        remaining = len(tasks)
        while remaining:
            item = await queue.get()
            if item is None:
                remaining -= 1
            elif isinstance(item, BaseException):
                raise item
            else:
                yield item
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await close_all(streams)
