"""The `Processor` seam: everything between an OpenAI request body and the router.

Inward, a processor turns a chat or completions request into one `EngineRequest` per
choice (chat template, tokenizer, sampling and stop mapping, context check). Outward, each
choice gets an `OutputProcessor` (the `EngineOutput` stream into `Delta`s of text:
incremental detokenization, stop strings) and, when the request has something to parse, a
`ChoiceParser` (`Delta`s into reasoning, content and tool calls). The OpenAI routes above
build chunks from what these give; the router client below sees only `EngineRequest`s.

stator's processor (`processor.stator`) is one implementation, vLLM's classes
(`processor.vllm`) the other; a model's card and `--processor` pick one per frontend.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from stator.frontend.openai.requests import ChatCompletionRequest, CompletionRequest
from stator.llm.postprocess import Delta
from stator.llm.prompt_embeds import PromptEmbeds
from stator.parsers import ParsedDelta
from stator.protocols import EngineOutput, EngineRequest

# One prompt: token ids, or embeddings the engine takes in their place (completions).
Prompt = list[int] | PromptEmbeds

PROCESSORS = ("stator", "vllm")


def prompt_length(prompt: Prompt) -> int:
    """Tokens the prompt occupies in the context (an embedding row is one token)."""
    return prompt.num_tokens if isinstance(prompt, PromptEmbeds) else len(prompt)


class OutputProcessor(Protocol):
    """One choice's engine outputs into text deltas."""

    def process(self, output: EngineOutput) -> Delta: ...

    @property
    def completion_tokens(self) -> int: ...

    @property
    def cached_tokens(self) -> int: ...


class ChoiceParser(Protocol):
    """One choice's deltas into reasoning, content and tool-call pieces."""

    def feed(self, delta: Delta) -> ParsedDelta: ...

    def finish(self) -> ParsedDelta: ...


@dataclass(slots=True)
class ChoicePlan:
    """One choice, ready to route: its engine request and how to read its outputs.
    `keep_token_deltas`: deltas whose tokens decode to no text still reach the parser
    (a parser that reads token ids, such as Harmony's)."""

    index: int
    request: EngineRequest
    output: OutputProcessor
    parser: ChoiceParser | None = None
    keep_token_deltas: bool = False


@dataclass(slots=True)
class PreparedRequest:
    """A request's prompts and its choices, numbered `prompt_index * n + choice`."""

    prompts: Sequence[Prompt]
    choices: list[ChoicePlan]

    @property
    def prompt_tokens(self) -> int:
        return sum(map(prompt_length, self.prompts))

    @property
    def parsers(self) -> list[ChoiceParser] | None:
        """Every choice's parser, or None when the request has nothing to parse."""
        parsers = [c.parser for c in self.choices]
        return None if any(p is None for p in parsers) else parsers  # type: ignore[return-value]


class Processor(Protocol):
    """One model's text side. Raises `errors.ApiError` (400) for what it cannot do."""

    # "stator" or "vllm": which implementation (shown in logs and errors).
    kind: str
    # Whether the model's output has a reasoning part to show (`reasoning_content`).
    has_reasoning: bool

    async def chat(self, body: ChatCompletionRequest, request_id: str) -> PreparedRequest: ...

    async def completion(self, body: CompletionRequest, request_id: str) -> PreparedRequest: ...

    def decode_prompt(self, ids: list[int]) -> str:
        """A prompt's text, as `echo` repeats it."""
        ...
