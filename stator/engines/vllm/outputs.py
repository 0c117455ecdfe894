"""vLLM `RequestOutput` deltas as stator `EngineOutput`s."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from vllm.outputs import RequestOutput

from stator.protocols import EngineOutput, FinishReason, TokenLogprob, TopLogprob, Usage

_FINISH: dict[str, FinishReason] = {
    "stop": "stop",
    "length": "length",
    "abort": "abort",
    "error": "error",
}


def token_logprob(token_id: int, alternatives: Mapping[int, Any], top_k: int) -> TokenLogprob:
    """One position: the chosen token's logprob and the `top_k` best alternatives."""
    chosen = alternatives.get(token_id)
    logprob = float(chosen.logprob) if chosen is not None else float("-inf")
    ranked = sorted(alternatives.items(), key=lambda item: item[1].rank or 0)
    top = [
        TopLogprob(tid, float(lp.logprob))
        for tid, lp in ranked
        if lp.rank is not None and lp.rank <= top_k
    ]
    return TokenLogprob(token_id=token_id, logprob=logprob, top=top[:top_k])


def logprobs_list(
    token_ids: Sequence[int], positions: Sequence[Mapping[int, Any] | None], top_k: int
) -> list[TokenLogprob | None]:
    return [
        None if alternatives is None else token_logprob(tid, alternatives, top_k)
        for tid, alternatives in zip(token_ids, positions, strict=False)
    ]


class OutputConverter:
    """Turns one request's stream of vLLM deltas into EngineOutputs (stateful: counts
    tokens for usage, sends cached tokens and prompt logprobs once)."""

    def __init__(
        self,
        prompt_token_ids: Sequence[int] | None,
        prompt_len: int,
        *,
        logprobs: int | None,
        prompt_logprobs: int | None,
        hidden_stop_ids: set[int],
    ) -> None:
        self.prompt_token_ids = list(prompt_token_ids or [])
        self.prompt_len = prompt_len
        self.logprobs = logprobs
        self.prompt_logprobs = prompt_logprobs
        self.hidden_stop_ids = hidden_stop_ids
        self.completion_tokens = 0
        self.cached_tokens = 0
        self.first = True

    def convert(self, ro: RequestOutput) -> EngineOutput:
        completion = ro.outputs[0]
        token_ids = list(completion.token_ids)
        self.completion_tokens += len(token_ids)
        out = EngineOutput(token_ids=token_ids)
        if self.logprobs is not None and completion.logprobs:
            entries = logprobs_list(token_ids, completion.logprobs, self.logprobs)
            out.logprobs = [e for e in entries if e is not None]
        if self.first:
            self.first = False
            self.cached_tokens = ro.num_cached_tokens or 0
            out.cached_tokens = self.cached_tokens
            if self.prompt_logprobs is not None and ro.prompt_logprobs:
                out.prompt_logprobs = logprobs_list(
                    self.prompt_token_ids, ro.prompt_logprobs, self.prompt_logprobs
                )
        if completion.finish_reason is not None:
            self._finish(out, completion.finish_reason, completion.stop_reason)
        return out

    def _finish(self, out: EngineOutput, reason: str, stop_reason: Any) -> None:
        out.finish_reason = _FINISH.get(reason, "stop")
        if reason == "stop" and out.token_ids:
            last = out.token_ids[-1]
            # stop_reason is the stop token id, or None when the model's EOS ended it.
            if stop_reason is None or stop_reason == last:
                out.stop_token_id = last
                if stop_reason is None or last in self.hidden_stop_ids:
                    out.token_ids = out.token_ids[:-1]
                    if out.logprobs:
                        out.logprobs = out.logprobs[: len(out.token_ids)]
        if reason == "error":
            out.error = "vLLM reported an error for this request"
        out.usage = Usage(
            prompt_tokens=self.prompt_len,
            completion_tokens=self.completion_tokens,
            cached_tokens=self.cached_tokens,
        )
