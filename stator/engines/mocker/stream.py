"""`RequestStream`: one request's outbox between the mocker's step loop and its
`generate` iterator. The loop appends tokens and sets `ready`; the iterator takes every
buffered token at once, so a slow consumer costs one wake-up, not one per token."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from stator.engines.mocker.output import TokenPlan, mock_logprob
from stator.engines.mocker.scheduler import Sequence
from stator.protocols import DisaggParams, EngineOutput, FinishReason, Usage

if TYPE_CHECKING:
    from stator.engines.mocker.engine import Rank


@dataclass(eq=False)
class RequestStream:
    seq: Sequence
    plan: TokenPlan
    rank: Rank
    ready: asyncio.Event = field(default_factory=asyncio.Event)
    tokens: list[int] = field(default_factory=list)
    finish_reason: FinishReason | None = None
    stop_token_id: int | None = None
    error: str | None = None
    produced: int = 0
    sent_first: bool = False
    disagg: DisaggParams | None = None
    # Top alternatives asked for per token (None: no logprobs), and the vocabulary size.
    logprobs: int | None = None
    vocab_size: int = 32000

    def take(self) -> EngineOutput:
        out = EngineOutput(token_ids=self.tokens, finish_reason=self.finish_reason)
        if self.logprobs is not None and self.tokens:
            first = self.produced - len(self.tokens)
            out.logprobs = [
                mock_logprob(t, first + i, self.logprobs, self.vocab_size)
                for i, t in enumerate(self.tokens)
            ]
        self.tokens = []
        if not self.sent_first:
            out.cached_tokens = self.seq.num_cached or 0
            self.sent_first = True
        if self.finish_reason is not None:
            out.stop_token_id = self.stop_token_id
            out.error = self.error
            out.disagg = self.disagg
            out.usage = Usage(
                prompt_tokens=self.seq.num_prompt,
                completion_tokens=self.produced,
                cached_tokens=self.seq.num_cached or 0,
            )
        return out
