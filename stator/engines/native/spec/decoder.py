"""Speculative decoding in the engine core: drafts before the step, verification after it.

Per step, for each decoding sequence that may speculate:

1. `reserve` (before scheduling) appends k draft slots to its tokens: prompt lookup fills
   them at once; a draft model fills them in `propose`, after scheduling, when the target's
   blocks for those positions exist. The scheduler then schedules 1 + k tokens for it like
   any other uncomputed tokens (and trims them when the step's budget is short).
2. The target computes the last real token and the k drafts in one forward pass (paged KV
   written for all of them), with a logits row at each of the k + 1 positions.
3. `verify` keeps the accepted drafts plus one token (rejection sampling: `verify.py`) and
   rolls the rest back by lowering `num_computed_tokens`: rejected drafts' KV slots are
   overwritten by later tokens, nothing is copied or freed.

Sequences that need the host per token (penalties, logprobs, structured output, min_tokens
not yet reached) decode one token at a time in the same batch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch

from stator.engines.native.request import Sequence, Status
from stator.engines.native.sampler import Sampler
from stator.engines.native.scheduler import ScheduledBatch
from stator.engines.native.spec.config import SpeculativeConfig
from stator.engines.native.spec.ngram import ngram_draft
from stator.engines.native.spec.verify import DraftGroup, verify

#: A draft slot a proposer has not filled yet (never a valid token id).
DRAFT_SLOT = -2


class ModelProposer(Protocol):
    def propose(
        self, seqs: list[Sequence], ks: list[int], starts: list[int]
    ) -> list[torch.Tensor | None]: ...

    def forget(self, request_id: str) -> None: ...

    def keep_only(self, request_ids: set[str]) -> None: ...

    def observe(self, seqs: list[Sequence], starts: list[int], num_new: list[int]) -> None:
        """After the target's forward pass (and any rollback): what it computed."""


@dataclass
class SpecStats:
    steps: int = 0  # verifications (one per sequence per step)
    drafted: int = 0  # draft tokens proposed and verified
    accepted: int = 0  # of those, accepted

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def mean_accepted_length(self) -> float:
        """Tokens emitted per verification: accepted drafts + the one the target adds."""
        return (self.accepted + self.steps) / self.steps if self.steps else 0.0


class SpecDecoder:
    def __init__(
        self, config: SpeculativeConfig, sampler: Sampler, model: ModelProposer | None
    ) -> None:
        self.config = config
        self.sampler = sampler
        self.model = model
        self.stats = SpecStats()
        self._drafts: dict[int, int] = {}  # id(seq) -> draft slots appended this step
        self._seqs: dict[int, Sequence] = {}
        self._probs: dict[int, torch.Tensor | None] = {}

    # -- before the forward pass ---------------------------------------------------------

    def can_speculate(self, seq: Sequence) -> bool:
        sp = seq.sampling
        return (
            seq.status is Status.RUNNING
            and seq.num_tokens - seq.num_computed_tokens == 1
            and seq.matcher is None
            and sp.logprobs is None
            and not sp.uses_penalties
            and seq.num_output_tokens >= sp.min_tokens
        )

    def reserve(self, running: list[Sequence], live: set[str]) -> None:
        """Append draft slots to every sequence that speculates this step."""
        self._drafts.clear()
        self._seqs.clear()
        self._probs.clear()
        if self.model is not None:
            self.model.keep_only(live)
        for seq in running:
            if not self.can_speculate(seq):
                continue
            room = min(
                seq.sampling.max_tokens - seq.num_output_tokens,
                seq.max_total_tokens - seq.num_tokens,
            )
            k = min(self.config.num_speculative_tokens, room - 1)  # the target adds one
            if k <= 0:
                continue
            if self.model is None:
                drafts = ngram_draft(
                    seq.token_ids, k, self.config.prompt_lookup_max, self.config.prompt_lookup_min
                )
            else:
                drafts = [DRAFT_SLOT] * k
            if drafts:
                seq.token_ids.extend(drafts)
                self._drafts[id(seq)] = len(drafts)
                self._seqs[id(seq)] = seq

    def num_drafts(self, seq: Sequence) -> int:
        return self._drafts.get(id(seq), 0)

    def propose(self, batch: ScheduledBatch) -> None:
        """After scheduling: drop the drafts of sequences that were preempted or cut short,
        then let a draft model fill the slots."""
        scheduled = {id(s): n for s, n in zip(batch.seqs, batch.num_new_tokens, strict=True)}
        for key, seq in list(self._seqs.items()):
            k = self._drafts[key]
            keep = max(0, min(k, scheduled.get(key, 0) - 1))
            if keep < k:
                del seq.token_ids[len(seq.token_ids) - (k - keep) :]
                if keep:
                    self._drafts[key] = keep
                else:
                    del self._drafts[key], self._seqs[key]
        for seq in batch.preempted:
            if self.model is not None:
                self.model.forget(seq.request_id)
        if self.model is None or not self._seqs:
            return
        seqs = list(self._seqs.values())
        ks = [self._drafts[id(s)] for s in seqs]
        starts = [s.num_tokens - k for s, k in zip(seqs, ks, strict=True)]
        for seq, probs in zip(seqs, self.model.propose(seqs, ks, starts), strict=True):
            self._probs[id(seq)] = probs

    # -- after the forward pass ----------------------------------------------------------

    def observe(self, seqs: list[Sequence], starts: list[int], num_new: list[int]) -> None:
        if self.model is not None:
            self.model.observe(seqs, starts, num_new)

    def verify(self, logits: torch.Tensor, first_rows: dict[int, int]) -> dict[int, list[int]]:
        """Accept or reject each speculating sequence's drafts (their k + 1 logits rows
        start at `first_rows[id(seq)]`), roll its tokens and KV count back to what was
        accepted, and return id(seq) -> the tokens it gained (accepted drafts + one)."""
        groups = []
        for key, first in first_rows.items():
            seq = self._seqs[key]
            k = self._drafts[key]
            groups.append(DraftGroup(seq, first, seq.token_ids[-k:], self._probs.get(key)))
        if not groups:
            return {}
        results = verify(self.sampler, logits, groups)
        gained: dict[int, list[int]] = {}
        for group, tokens in zip(groups, results, strict=True):
            seq, k = group.seq, len(group.drafts)
            accepted = len(tokens) - 1
            del seq.token_ids[len(seq.token_ids) - k :]
            seq.token_ids.extend(tokens)
            # KV of the rejected drafts is dropped by counting it as not computed.
            seq.num_computed_tokens -= k - accepted
            gained[id(seq)] = tokens
            self.stats.steps += 1
            self.stats.drafted += k
            self.stats.accepted += accepted
        return gained
