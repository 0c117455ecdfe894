"""A small draft model of the target's vocabulary proposes k tokens, one forward pass each.

The draft runs in its own `ModelRunner` with its own KV tensors, but shares the target's
block tables: it has as many blocks as the target, and position p of a sequence lives in
the same slot for both. The target's scheduler has already given each speculating sequence
blocks for its last real token and its k drafts, so the draft can write its KV for those
positions with no allocation of its own, and a rejected draft's KV is simply overwritten
later (no copies, no frees). Per sequence the draft remembers how many tokens it has
computed; the first pass catches up on whatever it has not seen (the prompt, the last
step's accepted tokens), the next k - 1 passes feed one draft token each.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

import torch

from stator.engines.native.config import ModelSpec, NativeConfig
from stator.engines.native.model_runner import ModelRunner
from stator.engines.native.request import Sequence
from stator.engines.native.sampler import Sampler


@dataclass(eq=False)
class _View:
    """What `ModelRunner.prepare` reads of a sequence, with the draft's own progress."""

    token_ids: list[int]
    block_ids: list[int]
    num_computed_tokens: int
    # The drafter reads token ids only (a prompt given as embeddings drafts poorly).
    prompt_embeds: None = None
    num_prompt_tokens: int = 0


class DraftModelProposer:
    def __init__(
        self,
        model_dir: str | Path,
        config: NativeConfig,
        target: ModelSpec,
        num_blocks: int,
        max_model_len: int,
        sampler: Sampler,
    ) -> None:
        spec = ModelSpec.from_dir(model_dir)
        if spec.vocab_size != target.vocab_size:
            raise ValueError(
                f"the draft model's vocabulary ({spec.vocab_size}) differs from the target's "
                f"({target.vocab_size})"
            )
        elem = 4 if config.dtype == "float32" else 2
        per_block = 2 * spec.num_layers * config.block_size * spec.num_kv_heads * spec.head_dim
        draft_config = dataclasses.replace(
            config,
            kv_cache_memory=str(num_blocks * per_block * elem),
            tensor_parallel_size=1,
            tune_gemv=False,
            speculative_config="",  # the draft itself verifies nothing: no verify graphs
        )
        self.runner = ModelRunner(spec, draft_config, model_dir, max_model_len)
        if self.runner.num_blocks < num_blocks:
            raise ValueError("the draft model's KV cache is smaller than the target's")
        self.sampler = sampler
        self._computed: dict[str, int] = {}  # request id -> tokens in the draft's cache

    def propose(
        self, seqs: list[Sequence], ks: list[int], starts: list[int]
    ) -> list[torch.Tensor | None]:
        """Fill seq.token_ids[starts[i] : starts[i] + ks[i]] (the draft slots after the last
        real token) with draft tokens; returns each sequence's [k, V] draft distribution."""
        # The draft's KV is valid no further than the target's (rejected drafts).
        views = [
            _View(s.token_ids, s.block_ids, min(self._computed.get(s.request_id, 0), start - 1))
            for s, start in zip(seqs, starts, strict=True)
        ]
        probs: list[list[torch.Tensor]] = [[] for _ in seqs]
        for i in range(max(ks)):
            active = [b for b, k in enumerate(ks) if k > i]
            batch = [views[b] for b in active]
            # Pass 0 catches up to the last real token; pass i feeds draft i - 1.
            num_new = [starts[b] + i - views[b].num_computed_tokens for b in active]
            rows = list(_last_rows(num_new))
            inputs = self.runner.prepare(batch, num_new, rows)  # type: ignore[arg-type]
            logits = self.runner.execute(inputs)
            owners = [seqs[b] for b in active]
            q = self.sampler.probs(logits, owners)
            tokens = self.sampler.draw(q, owners).tolist()
            for j, b in enumerate(active):
                views[b].num_computed_tokens += num_new[j]
                seqs[b].token_ids[starts[b] + i] = tokens[j]
                probs[b].append(q[j])
        for s, v in zip(seqs, views, strict=True):
            self._computed[s.request_id] = v.num_computed_tokens
        return [torch.stack(p) if p else None for p in probs]

    def forget(self, request_id: str) -> None:
        """The sequence finished, or lost its blocks (preempted): start over next time."""
        self._computed.pop(request_id, None)

    def observe(self, seqs: list[Sequence], starts: list[int], num_new: list[int]) -> None:
        """A draft model reads tokens only (see `propose`)."""

    def keep_only(self, request_ids: set[str]) -> None:
        for rid in [r for r in self._computed if r not in request_ids]:
            del self._computed[rid]


def _last_rows(num_new: list[int]) -> list[int]:
    """The flat index of each sequence's last new token (its logits row)."""
    out, total = [], 0
    for n in num_new:
        total += n
        out.append(total - 1)
    return out
