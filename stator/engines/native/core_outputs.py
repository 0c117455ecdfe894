"""How the engine core turns known tokens into `EngineOutput`s (`EngineCore` mixes it in):
stop rules token by token, usage on the last output, prompt logprobs, and the tokens of an
overlapped step read one step late."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from stator.engines.native.overlap import PLACEHOLDER, PendingStep
from stator.engines.native.request import Sequence, Status
from stator.engines.native.sampler import gather_logprobs
from stator.protocols import EngineOutput, TokenLogprob, Usage


@dataclass
class PromptLogprobRows:
    seq: Sequence
    first_row: int  # row in the logits tensor
    first_target: int  # prompt position of the first token these rows predict
    count: int


class OutputEmitter:
    def _add_placeholder(self, seq: Sequence) -> None:
        seq.token_ids.append(PLACEHOLDER)
        sp = seq.sampling
        if seq.num_output_tokens >= sp.max_tokens or seq.num_tokens >= seq.max_total_tokens:
            # It ends with this token whatever the token is: no step after it.
            self.scheduler.retire(seq)

    def _resolve(self, pending: PendingStep) -> list[tuple[str, EngineOutput]]:
        """Read a deferred step's tokens and emit them; a sequence finished or aborted
        since then has its token discarded."""
        outputs = []
        tokens = pending.tokens()
        for seq, pos, token in zip(pending.seqs, pending.positions, tokens, strict=True):
            if seq.status is Status.FINISHED:
                continue
            seq.token_ids[pos] = token
            outputs.append((seq.request_id, self._accept_token(seq, pos, None)))
        return outputs

    def _add_prompt_logprobs(self, pr: PromptLogprobRows, logits: torch.Tensor) -> None:
        seq = pr.seq
        lp = torch.log_softmax(logits[pr.first_row : pr.first_row + pr.count], dim=-1)
        targets = torch.tensor(
            seq.token_ids[pr.first_target : pr.first_target + pr.count], device=lp.device
        )
        entries = gather_logprobs(lp, targets, [seq.sampling.prompt_logprobs] * pr.count)
        for i, entry in enumerate(entries):
            # After a preemption the prompt is recomputed; keep the first copy.
            if pr.first_target + i == len(seq.prompt_logprobs):
                seq.prompt_logprobs.append(entry)

    def _emit_tokens(self, seq: Sequence, count: int) -> EngineOutput:
        """The last `count` tokens of `seq` are known: one output for all of them (the
        stop rules apply token by token; a stop drops the tokens after it)."""
        first = seq.num_tokens - count
        merged: EngineOutput | None = None
        for pos in range(first, first + count):
            out = self._accept_token(seq, pos, None)
            if merged is None:
                merged = out
            else:
                merged.token_ids.extend(out.token_ids)
                merged.finish_reason, merged.stop_token_id = out.finish_reason, out.stop_token_id
                merged.usage, merged.error = out.usage, out.error
            if out.finish_reason is not None:
                break
        assert merged is not None
        return merged

    def _accept_token(self, seq: Sequence, pos: int, logprob: TokenLogprob | None) -> EngineOutput:
        """The token at `pos` is known: emit it and apply the stop rules as of that token
        (a later position may hold the placeholder of a step already launched)."""
        sp = seq.sampling
        token = seq.token_ids[pos]
        num_output = pos + 1 - seq.num_prompt_tokens
        out = EngineOutput(token_ids=[token])
        if sp.logprobs is not None and logprob is not None:
            out.logprobs = [logprob]
        if seq.num_emitted == 0:
            out.cached_tokens = seq.num_cached_tokens or 0
            if sp.prompt_logprobs is not None:
                out.prompt_logprobs = seq.prompt_logprobs
        seq.num_emitted += 1
        done_min = num_output >= sp.min_tokens
        broken = self.guidance.accept(seq, token) if seq.matcher is not None else None
        if broken is not None:
            out.finish_reason, out.error = "error", broken
        elif token in sp.hidden_stop_token_ids and done_min:
            out.token_ids, out.logprobs = [], None
            out.finish_reason, out.stop_token_id = "stop", token
        elif token in sp.stop_token_ids and done_min:
            out.finish_reason, out.stop_token_id = "stop", token
        elif num_output >= sp.max_tokens or pos + 1 >= seq.max_total_tokens:
            out.finish_reason = "length"
        if out.finish_reason is not None:
            del seq.token_ids[pos + 1 :]  # a speculative next token is never emitted
            out.usage = Usage(
                prompt_tokens=seq.num_prompt_tokens,
                completion_tokens=seq.num_output_tokens,
                cached_tokens=seq.num_cached_tokens or 0,
            )
            self.seqs.pop(seq.request_id, None)
            if seq.export and out.finish_reason == "length":
                self.scheduler.detach(seq)
                self._export(seq, out)
            else:
                self.scheduler.remove(seq)
        return out
