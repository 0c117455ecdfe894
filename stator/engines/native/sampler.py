"""Batched sampling: one row of logits per sequence in, one token (and logprobs) out.

Every rule is a tensor operation over the whole batch (no Python loop over the vocabulary).
Randomness is an exponential race: token = argmax(p / e) with e ~ Exp(1) is a draw from p.
A seeded request draws its noise from its own generator, so its tokens do not depend on
which other requests share the batch. Logprobs are those of the model's raw distribution.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from stator.engines.native.overlap import to_device
from stator.engines.native.request import Sequence
from stator.protocols import TokenLogprob, TopLogprob

#: Turns logits into constrained logits (structured output's bitmask); the bool says
#: whether a row may already be all -inf.
Constrain = Callable[[torch.Tensor, bool], torch.Tensor]


@dataclass
class SampleResult:
    token_ids: list[int]
    logprobs: list[TokenLogprob | None]


class Sampler:
    def __init__(self, vocab_size: int, device: torch.device, seed: int = 0) -> None:
        self.vocab_size = vocab_size
        self.device = device
        self.generator = torch.Generator(device=device)
        self.generator.manual_seed(seed)

    def sample(
        self, logits: torch.Tensor, seqs: list[Sequence], constrain: Constrain | None = None
    ) -> SampleResult:
        """`logits` [N, V] (one row per sequence of `seqs`, in order)."""
        logits = logits.float()
        raw_logprobs = None
        if any(s.sampling.logprobs is not None for s in seqs):
            raw_logprobs = torch.log_softmax(logits, dim=-1)
        tokens = self.sample_tokens(logits, seqs, constrain)
        token_list = tokens.tolist()
        logprobs: list[TokenLogprob | None] = [None] * len(seqs)
        if raw_logprobs is not None:
            logprobs = gather_logprobs(raw_logprobs, tokens, [s.sampling.logprobs for s in seqs])
        return SampleResult(token_list, logprobs)

    def sample_tokens(
        self, logits: torch.Tensor, seqs: list[Sequence], constrain: Constrain | None = None
    ) -> torch.Tensor:
        """The tokens [N] (int64) as a device tensor: the host does not wait for them.
        `constrain(logits, guard)`: structured output's mask, applied after the other
        processors (`guard`: bias or min_tokens may have emptied a row)."""
        logits = logits.float()
        biased = any(s.sampling.logit_bias or s.sampling.min_tokens for s in seqs)
        if biased:
            logits = self._apply_bias_and_min_tokens(logits.clone(), seqs)
        if any(s.sampling.uses_penalties for s in seqs):
            logits = self._apply_penalties(logits, seqs)
        if constrain is not None:
            logits = constrain(logits, biased)
        return self._pick(logits, seqs)

    def probs(self, logits: torch.Tensor, seqs: list[Sequence]) -> torch.Tensor:
        """[N, V]: the distribution `sample_tokens` draws each row from (one-hot at the
        argmax for greedy rows). Speculative decoding verifies drafts against it."""
        logits = logits.float()
        if any(s.sampling.logit_bias or s.sampling.min_tokens for s in seqs):
            logits = self._apply_bias_and_min_tokens(logits.clone(), seqs)
        if any(s.sampling.uses_penalties for s in seqs):
            logits = self._apply_penalties(logits, seqs)
        one_hot = torch.zeros_like(logits).scatter_(1, logits.argmax(dim=-1, keepdim=True), 1.0)
        if all(s.sampling.greedy for s in seqs):
            return one_hot
        dev = self.device
        temps = to_device([s.sampling.temperature or 1.0 for s in seqs], dev, torch.float32)
        probs = torch.softmax(_top_k_top_p_min_p(logits / temps[:, None], seqs, dev), dim=-1)
        is_greedy = to_device([s.sampling.greedy for s in seqs], dev, torch.bool)
        return torch.where(is_greedy[:, None], one_hot, probs)

    def greedy(self, logits: torch.Tensor, seqs: list[Sequence]) -> torch.Tensor:
        """[N]: each row's argmax after the logit processors (greedy rows' choice)."""
        logits = logits.float()
        if any(s.sampling.logit_bias or s.sampling.min_tokens for s in seqs):
            logits = self._apply_bias_and_min_tokens(logits.clone(), seqs)
        if any(s.sampling.uses_penalties for s in seqs):
            logits = self._apply_penalties(logits, seqs)
        return logits.argmax(dim=-1)

    def draw(self, probs: torch.Tensor, seqs: list[Sequence]) -> torch.Tensor:
        """One token per row of `probs` [N, V] (an exponential race; seeded sequences use
        their own generator)."""
        noise = torch.empty_like(probs).exponential_(generator=self.generator)
        for i, seq in enumerate(seqs):
            if seq.generator is not None:
                noise[i].exponential_(generator=seq.generator)
        return (probs / noise).argmax(dim=-1)

    def uniform(self, seqs: list[Sequence]) -> torch.Tensor:
        """One U[0, 1) draw per entry of `seqs` (seeded sequences: their own generator)."""
        u = torch.rand(len(seqs), generator=self.generator, device=self.device)
        for i, seq in enumerate(seqs):
            if seq.generator is not None:
                u[i] = torch.rand(1, generator=seq.generator, device=self.device)[0]
        return u

    # -- logit processors ----------------------------------------------------------------

    def _apply_bias_and_min_tokens(
        self, logits: torch.Tensor, seqs: list[Sequence]
    ) -> torch.Tensor:
        rows: list[int] = []
        cols: list[int] = []
        values: list[float] = []
        for i, seq in enumerate(seqs):
            for token, bias in seq.sampling.logit_bias.items():
                rows.append(i)
                cols.append(token)
                values.append(bias)
        if rows:
            index = (to_device(rows, self.device), to_device(cols, self.device))
            logits.index_put_(index, to_device(values, self.device, torch.float32), accumulate=True)
        rows, cols = [], []
        for i, seq in enumerate(seqs):
            sp = seq.sampling
            if seq.num_output_tokens < sp.min_tokens:
                stops = sp.stop_token_ids | sp.hidden_stop_token_ids
                rows.extend([i] * len(stops))
                cols.extend(stops)
        if rows:
            index = (to_device(rows, self.device), to_device(cols, self.device))
            logits.index_put_(index, to_device([float("-inf")], self.device, torch.float32))
        return logits

    def _apply_penalties(self, logits: torch.Tensor, seqs: list[Sequence]) -> torch.Tensor:
        n, vocab = logits.shape
        dev = self.device
        out_counts = _token_counts([s.output_ids for s in seqs], n, vocab, dev)
        prompt_seen = (
            _token_counts([s.token_ids[: s.num_prompt_tokens] for s in seqs], n, vocab, dev) > 0
        )
        presence = torch.tensor([s.sampling.presence_penalty for s in seqs], device=dev)
        frequency = torch.tensor([s.sampling.frequency_penalty for s in seqs], device=dev)
        repetition = torch.tensor([s.sampling.repetition_penalty for s in seqs], device=dev)
        # Repetition penalty (CTRL): shrink the logits of any token seen in prompt or output.
        seen = prompt_seen | (out_counts > 0)
        rep = repetition[:, None].expand_as(logits)
        penalized = torch.where(logits > 0, logits / rep, logits * rep)
        logits = torch.where(seen, penalized, logits)
        # OpenAI presence and frequency penalties: over generated tokens only.
        logits = logits - frequency[:, None] * out_counts
        return logits - presence[:, None] * (out_counts > 0).float()

    # -- choosing ------------------------------------------------------------------------

    def _pick(self, logits: torch.Tensor, seqs: list[Sequence]) -> torch.Tensor:
        greedy_tokens = logits.argmax(dim=-1)
        if all(s.sampling.greedy for s in seqs):
            return greedy_tokens
        dev = self.device
        temps = to_device([s.sampling.temperature or 1.0 for s in seqs], dev, torch.float32)
        logits = logits / temps[:, None]
        logits = _top_k_top_p_min_p(logits, seqs, dev)
        probs = torch.softmax(logits, dim=-1)
        noise = torch.empty_like(probs).exponential_(generator=self.generator)
        for i, seq in enumerate(seqs):
            if seq.generator is not None and not seq.sampling.greedy:
                noise[i].exponential_(generator=seq.generator)
        sampled = (probs / noise).argmax(dim=-1)
        is_greedy = to_device([s.sampling.greedy for s in seqs], dev, torch.bool)
        return torch.where(is_greedy, greedy_tokens, sampled)


def _token_counts(
    token_lists: list[list[int]], n: int, vocab: int, device: torch.device
) -> torch.Tensor:
    counts = torch.zeros(n, vocab, device=device)
    width = max((len(t) for t in token_lists), default=0)
    if width == 0:
        return counts
    # Pad with an extra column `vocab` that is dropped after the scatter.
    padded = torch.full((n, width), vocab, dtype=torch.long)
    for i, tokens in enumerate(token_lists):
        padded[i, : len(tokens)] = torch.tensor(tokens, dtype=torch.long)
    wide = torch.zeros(n, vocab + 1, device=device)
    wide.scatter_add_(1, padded.to(device), torch.ones(n, width, device=device))
    return wide[:, :vocab]


def _top_k_top_p_min_p(
    logits: torch.Tensor, seqs: list[Sequence], device: torch.device
) -> torch.Tensor:
    vocab = logits.shape[-1]
    top_k = [s.sampling.top_k if 0 < s.sampling.top_k < vocab else vocab for s in seqs]
    top_p = [s.sampling.top_p for s in seqs]
    min_p = [s.sampling.min_p for s in seqs]
    if min(top_k) < vocab or min(top_p) < 1.0:
        sorted_logits, order = logits.sort(dim=-1, descending=True)
        ranks = torch.arange(vocab, device=device)[None, :]
        drop = ranks >= to_device(top_k, device)[:, None]
        probs = torch.softmax(sorted_logits.masked_fill(drop, float("-inf")), dim=-1)
        # Keep the smallest prefix whose mass reaches top_p (the first token always stays).
        mass_before = probs.cumsum(dim=-1) - probs
        drop |= mass_before >= to_device(top_p, device, torch.float32)[:, None]
        drop[:, 0] = False
        logits = logits.scatter(1, order, sorted_logits.masked_fill(drop, float("-inf")))
    if max(min_p) > 0.0:
        probs = torch.softmax(logits, dim=-1)
        threshold = (
            to_device(min_p, device, torch.float32)[:, None]
            * probs.max(dim=-1, keepdim=True).values
        )
        logits = logits.masked_fill(probs < threshold, float("-inf"))
    return logits


def gather_logprobs(
    logprobs: torch.Tensor, tokens: torch.Tensor, num_top: list[int | None]
) -> list[TokenLogprob | None]:
    """Per row: the logprob of `tokens[i]` and the `num_top[i]` most likely alternatives."""
    chosen = logprobs.gather(1, tokens[:, None].long()).squeeze(1).tolist()
    k = max((t or 0 for t in num_top), default=0)
    top_vals: list[list[float]] = []
    top_ids: list[list[int]] = []
    if k > 0:
        values, ids = logprobs.topk(k, dim=-1)
        top_vals, top_ids = values.tolist(), ids.tolist()
    token_list = tokens.tolist()
    out: list[TokenLogprob | None] = []
    for i, want in enumerate(num_top):
        if want is None:
            out.append(None)
            continue
        top = [TopLogprob(top_ids[i][j], top_vals[i][j]) for j in range(want)]
        out.append(TokenLogprob(token_id=token_list[i], logprob=chosen[i], top=top))
    return out
