"""Verification of draft tokens by the target model: rejection sampling that leaves the
output distribution exactly the target's (Leviathan et al. 2023, Chen et al. 2023).

Draft token x at position j, drawn from the draft's distribution q_j, is accepted with
probability min(1, p_j(x) / q_j(x)), where p_j is the target's distribution there (after
temperature, top-k/top-p/min-p, bias: `Sampler.probs`). At the first rejection the token
comes from the residual max(0, p_j - q_j), renormalized; when every draft is accepted a
bonus token comes from p_{k}. Greedy rows have one-hot p: a draft survives exactly when it
is the target's argmax, and the token after it is the argmax, so greedy output is identical
to decoding without speculation. Prompt lookup drafts deterministically: q is one-hot.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from stator.engines.native.overlap import to_device
from stator.engines.native.request import Sequence
from stator.engines.native.sampler import Sampler


@dataclass
class DraftGroup:
    """One sequence's drafts: its k + 1 target rows start at `first_row` (row j scores
    the token after draft j - 1; row 0 the one after the last real token)."""

    seq: Sequence
    first_row: int
    drafts: list[int]
    # [k, V] draft distributions, or None for deterministic drafts (one-hot q).
    draft_probs: torch.Tensor | None = None


def verify(
    sampler: Sampler, target_logits: torch.Tensor, groups: list[DraftGroup]
) -> list[list[int]]:
    """Per group: its accepted drafts followed by one more token (1..k + 1 tokens)."""
    dev = target_logits.device
    rows: list[int] = []
    row_seqs: list[Sequence] = []
    for g in groups:
        rows.extend(range(g.first_row, g.first_row + len(g.drafts) + 1))
        row_seqs.extend([g.seq] * (len(g.drafts) + 1))
    logits = target_logits.index_select(0, to_device(rows, dev))
    if all(g.seq.sampling.greedy for g in groups):
        return _verify_greedy(sampler, logits, row_seqs, groups)
    p = sampler.probs(logits, row_seqs)
    # Flat draft positions: their row in `p`, token, and q(token).
    draft_rows: list[int] = []
    draft_tokens: list[int] = []
    draft_seqs: list[Sequence] = []
    q_x_parts: list[torch.Tensor] = []
    base = 0
    for g in groups:
        k = len(g.drafts)
        draft_rows.extend(range(base, base + k))
        draft_tokens.extend(g.drafts)
        draft_seqs.extend([g.seq] * k)
        if k:
            if g.draft_probs is None:
                q_x_parts.append(torch.ones(k, device=dev))
            else:
                idx = to_device(g.drafts, dev)[:, None]
                q_x_parts.append(g.draft_probs[:k].gather(1, idx).squeeze(1))
        base += k + 1
    accepted = [0] * len(groups)
    if draft_rows:
        tokens = to_device(draft_tokens, dev)
        p_x = p.index_select(0, to_device(draft_rows, dev)).gather(1, tokens[:, None]).squeeze(1)
        q_x = torch.cat(q_x_parts)
        # u < p/q without the division (q(x) > 0: x was drawn from q).
        ok = (sampler.uniform(draft_seqs) * q_x < p_x).tolist()
        i = 0
        for gi, g in enumerate(groups):
            k = len(g.drafts)
            n = 0
            while n < k and ok[i + n]:
                n += 1
            accepted[gi] = n
            i += k
    # The token after the accepted drafts: from the residual at the first rejection, or
    # the bonus from p at the end.
    final_rows: list[torch.Tensor] = []
    base = 0
    for g, n in zip(groups, accepted, strict=True):
        k = len(g.drafts)
        row = p[base + n]
        if n < k:
            if g.draft_probs is None:
                residual = row.clone()
                residual[g.drafts[n]] = 0.0
            else:
                residual = (row - g.draft_probs[n]).clamp_(min=0.0)
            # Rounding can leave nothing (p == q): then p itself is the right law.
            row = torch.where(residual.sum() > 0, residual, row)
        final_rows.append(row)
        base += k + 1
    finals = sampler.draw(torch.stack(final_rows), [g.seq for g in groups]).tolist()
    return [[*g.drafts[:n], t] for g, n, t in zip(groups, accepted, finals, strict=True)]


def _verify_greedy(
    sampler: Sampler, logits: torch.Tensor, row_seqs: list[Sequence], groups: list[DraftGroup]
) -> list[list[int]]:
    """All greedy: one argmax per row and one read; a draft survives while it equals the
    target's choice, and the choice at the first mismatch (or after the last draft) is
    the token added."""
    best = sampler.greedy(logits, row_seqs).tolist()
    out = []
    base = 0
    for g in groups:
        n = 0
        while n < len(g.drafts) and g.drafts[n] == best[base + n]:
            n += 1
        out.append([*g.drafts[:n], best[base + n]])
        base += len(g.drafts) + 1
    return out
