"""`ChoiceProcessor`: one choice's stream of `EngineOutput`s in, `Delta`s of text out.

    EngineOutput ─▶ IncrementalDetokenizer ─▶ StopStringMatcher ─▶ Delta(text, ...)
                                                                     │
                        reasoning / tool-call parsers (stator.parsers) consume Delta.text

A stop string ends the choice with finish_reason "stop" while the engine is still
generating: the caller must then abort the engine request (close its stream). The
processor is pure and synchronous: it never touches the network.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from dataclasses import dataclass, field

from stator.llm.detokenizer import IncrementalDetokenizer
from stator.llm.stop_strings import StopStringMatcher
from stator.llm.tokenizer import Tokenizer
from stator.protocols import EngineOutput, FinishReason, TokenLogprob, Usage


@dataclass(slots=True)
class TopLogprobEntry:
    token_id: int
    token: str
    bytes: list[int]
    logprob: float


@dataclass(slots=True)
class LogprobEntry:
    """One generated token's logprob, shaped as OpenAI reports it (token text and raw
    bytes), keeping the id for callers that need it."""

    token_id: int
    token: str
    bytes: list[int]
    logprob: float
    top: list[TopLogprobEntry] = field(default_factory=list)


@dataclass(slots=True)
class Delta:
    """What one engine output adds to a choice."""

    text: str
    token_ids: list[int]
    logprobs: list[LogprobEntry] | None = None
    finish_reason: FinishReason | None = None
    # The stop string, or the visible stop token id, that ended the choice (None for EOS
    # and for length), as vLLM reports it.
    stop_reason: str | int | None = None
    error: str | None = None


class ChoiceProcessor:
    def __init__(
        self,
        tokenizer: Tokenizer,
        stop_strings: Iterable[str] = (),
        skip_special_tokens: bool = True,
        prompt_token_ids: Collection[int] = (),
        *,
        include_stop_str: bool = False,
        hidden_stop_token_ids: Collection[int] | None = None,
    ) -> None:
        self._tokenizer = tokenizer
        self._detok = IncrementalDetokenizer(
            tokenizer, prompt_ids=prompt_token_ids, skip_special_tokens=skip_special_tokens
        )
        stops = [s for s in stop_strings if s]
        self._matcher = StopStringMatcher(stops, include_stop_str) if stops else None
        self._hidden = frozenset(
            tokenizer.eos_token_ids if hidden_stop_token_ids is None else hidden_stop_token_ids
        )
        self.prompt_tokens = len(prompt_token_ids)
        self.completion_tokens = 0
        self.cached_tokens = 0
        self.finish_reason: FinishReason | None = None
        self.stop_reason: str | int | None = None

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    @property
    def usage(self) -> Usage:
        return Usage(
            prompt_tokens=self.prompt_tokens,
            completion_tokens=self.completion_tokens,
            cached_tokens=self.cached_tokens,
        )

    def process(self, output: EngineOutput) -> Delta:
        """Run one engine output through. After the choice has finished, outputs still
        in flight are ignored (an empty Delta without a finish reason)."""
        ids = output.token_ids
        if self.finish_reason is not None:
            return Delta("", [])
        self.completion_tokens += len(ids)
        if output.usage is not None and output.usage.completion_tokens > self.completion_tokens:
            # A hidden EOS is counted by the engine but not sent.
            self.completion_tokens = output.usage.completion_tokens
        if output.cached_tokens is not None:
            self.cached_tokens = output.cached_tokens

        logprobs = self._logprobs(output.logprobs) if output.logprobs else None
        finish = output.finish_reason
        text = self._detok.add(ids) if ids else ""
        matcher = self._matcher
        if finish is None:
            # The per-token path: no finish yet, so only a stop string can end the choice.
            if matcher is not None and text:
                text, stopped = matcher.feed(text)
                if stopped is not None:
                    self.finish_reason, self.stop_reason = "stop", stopped
                    return Delta(text, ids, logprobs, "stop", stopped)
            return Delta(text, ids, logprobs)

        text += self._detok.flush()
        stop_reason: str | int | None = None
        if matcher is not None:
            text, stopped = matcher.feed(text)
            if stopped is not None:
                finish, stop_reason = "stop", stopped
            else:
                text += matcher.flush()
        if finish == "stop" and stop_reason is None:
            token = output.stop_token_id
            if token is not None and token not in self._hidden:
                stop_reason = token  # a visible stop token; EOS reports None
        self.finish_reason, self.stop_reason = finish, stop_reason
        error = output.error if finish == "error" else None
        return Delta(text, ids, logprobs, finish, stop_reason, error)

    def _logprobs(self, entries: list[TokenLogprob]) -> list[LogprobEntry]:
        info = self._tokenizer.token_info
        out = []
        for entry in entries:
            token, raw = info(entry.token_id)
            top = []
            for alt in entry.top:
                alt_token, alt_raw = info(alt.token_id)
                top.append(TopLogprobEntry(alt.token_id, alt_token, alt_raw, alt.logprob))
            out.append(LogprobEntry(entry.token_id, token, raw, entry.logprob, top))
        return out
