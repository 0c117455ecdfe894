"""`Sequence`: one request's state inside the engine (tokens, progress, KV blocks, how to
sample and when to stop)."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

import torch

from stator.protocols import TokenLogprob


@dataclass
class SamplingSpec:
    """A request's sampling and stopping rules with every default resolved."""

    temperature: float = 1.0  # 0 = greedy
    top_p: float = 1.0
    top_k: int = 0  # 0 = off
    min_p: float = 0.0
    seed: int | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logit_bias: dict[int, float] = field(default_factory=dict)
    logprobs: int | None = None
    prompt_logprobs: int | None = None
    max_tokens: int = 16
    min_tokens: int = 0
    stop_token_ids: frozenset[int] = frozenset()  # visible: emitted, then stop
    hidden_stop_token_ids: frozenset[int] = frozenset()  # EOS: stop, not emitted

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0

    @property
    def uses_penalties(self) -> bool:
        return (
            self.presence_penalty != 0.0
            or self.frequency_penalty != 0.0
            or self.repetition_penalty != 1.0
        )


class Status(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass(eq=False)
class Sequence:
    request_id: str
    token_ids: list[int]  # prompt, then generated tokens
    num_prompt_tokens: int
    sampling: SamplingSpec
    max_total_tokens: int  # context limit: prompt + output never exceed it
    status: Status = Status.WAITING
    num_computed_tokens: int = 0  # tokens whose KV is in the cache
    block_ids: list[int] = field(default_factory=list)
    block_hashes: list[int] = field(default_factory=list)  # chained hashes of full blocks
    num_committed_blocks: int = 0  # leading blocks already offered to the prefix cache
    num_cached_tokens: int | None = None  # prefix-cache hit at first admission
    loading: bool = False  # blocks being copied in from a lower tier: compute next step
    queued_at_step: int = 0  # the scheduler's step count when it last joined the queue
    overtaken: int = 0  # later arrivals admitted before it since then (--scheduling-policy lof)
    generator: torch.Generator | None = None  # per-request RNG (seeded requests)
    prompt_logprobs: list[TokenLogprob | None] = field(default_factory=list)
    finish_reason: str | None = None
    stop_token_id: int | None = None
    num_emitted: int = 0  # generated tokens already streamed to the caller
    matcher: Any = None  # structured output: the grammar state after the last real token
    export: bool = False  # prefill role: pin the prompt's KV for a decode worker at the end
    lora_name: str | None = None  # the adapter's name: part of the KV block hashes
    lora: Any = None  # the adapter itself (`lora.adapter.LoraAdapter`), None: base model
    # Embedding rows that replace the prompt's token embeddings [prompt, hidden] (on the
    # device); such a sequence's KV is never shared through the prefix cache.
    prompt_embeds: torch.Tensor | None = None

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def output_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens :]

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def is_prefilling(self) -> bool:
        return self.num_tokens - self.num_computed_tokens > 1

    @property
    def wants_prompt_logprobs(self) -> bool:
        return self.sampling.prompt_logprobs is not None
