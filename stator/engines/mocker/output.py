"""What the mocker "generates" for a request, and when it stops.

Random mode draws token ids from a generator seeded by the request's seed (or, without
one, its request id), so the same request always yields the same tokens. Ids come from
the upper half of the vocabulary (at most [1000, vocab)), like Dynamo's [1000, 2000): low
ids are where tokenizers keep their special tokens, and a mock reply should not stop on a
stray EOS. Echo mode repeats the prompt, which lets tests place stop tokens exactly.
"""

from __future__ import annotations

import random
from typing import Literal

import xxhash

from stator.protocols import EngineRequest, FinishReason, TokenLogprob, TopLogprob

OutputMode = Literal["random", "echo"]


class TokenPlan:
    """Token source and stop rules for one request."""

    __slots__ = (
        "_echo",
        "_high",
        "_low",
        "_next",
        "_rng",
        "hidden_stop",
        "max_tokens",
        "min_tokens",
        "visible_stop",
    )

    def __init__(
        self, request: EngineRequest, mode: OutputMode, vocab_size: int, max_tokens: int
    ) -> None:
        self.max_tokens = max_tokens
        self.min_tokens = request.stop.min_tokens
        self.visible_stop = frozenset(request.stop.stop_token_ids)
        self.hidden_stop = (
            frozenset()
            if request.stop.ignore_eos
            else frozenset(request.stop.stop_token_ids_hidden)
        )
        self._echo = request.token_ids if mode == "echo" else None
        self._next = 0
        seed = request.sampling.seed
        if seed is None:
            seed = xxhash.xxh3_64_intdigest(request.request_id.encode())
        self._rng = random.Random(seed)
        self._low = min(1000, vocab_size // 2)
        self._high = max(vocab_size, self._low + 1)

    def next_token(self) -> int:
        if self._echo is not None:
            token = self._echo[self._next % len(self._echo)]
            self._next += 1
            return token
        # random() is ~10x cheaper than randrange(); the tiny bias does not matter here.
        return self._low + int(self._rng.random() * (self._high - self._low))

    def finish(self, token: int, produced: int) -> tuple[FinishReason | None, bool]:
        """After the `produced`-th token `token`: (finish reason or None, is it shown?)."""
        if produced >= self.min_tokens:
            if token in self.hidden_stop:
                return "stop", False
            if token in self.visible_stop:
                return "stop", True
        if produced >= self.max_tokens:
            return "length", True
        return None, True


def mock_logprob(token: int, position: int, top: int, vocab_size: int) -> TokenLogprob:
    """Made-up but well-formed logprobs for one sampled token, as a real engine shapes
    them: the sampled token's logprob (< 0), and `top` alternatives in descending order
    with the sampled token first (as greedy decoding would have it). Deterministic in
    (token, position), so a test can compare runs."""
    mixed = xxhash.xxh3_64_intdigest(f"{token}:{position}".encode())
    chosen = -0.01 - (mixed % 2000) / 1000.0  # in (-2.01, -0.01]
    alternatives = [TopLogprob(token, chosen)]
    for k in range(1, top):
        other = (token + k * 7919) % vocab_size
        alternatives.append(TopLogprob(other, chosen - 0.75 * k))
    return TokenLogprob(token_id=token, logprob=chosen, top=alternatives[:top])
