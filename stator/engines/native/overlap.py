"""Overlapped steps: the host schedules and prepares step n+1 while the GPU runs step n.

A step whose sampling needs nothing from the host (no logprobs, no penalties: see
`deferrable`) leaves its sampled tokens on the device. Each sampled sequence gets a
placeholder token at once, so the scheduler sees it decoding and plans the next step; the
next step's input ids are then patched on the device from the previous step's token
tensor (`patch_inputs`), and the host reads the real tokens one step late, from a
non-blocking copy into pinned memory that an event marks complete (`PendingStep.tokens`).
The engine core resolves a pending step only after launching the next one, so the GPU
always has work queued while the host does its bookkeeping.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from stator.engines.native.request import Sequence

#: Stands in for a sampled token the host has not read yet. Never a valid id: an input
#: left unpatched fails loudly in the embedding lookup instead of computing garbage.
PLACEHOLDER = -1


def to_device(values: list | torch.Tensor, device: torch.device, dtype=torch.long) -> torch.Tensor:
    """A host list (or CPU tensor) on `device` without making the host wait: on CUDA it
    goes through pinned memory. (A copy from pageable memory, which `torch.tensor(...,
    device=...)` and indexing with a list make, waits for the stream to drain: it would
    undo the overlap.)"""
    if device.type != "cuda":
        return torch.as_tensor(values, dtype=dtype)
    host = values if isinstance(values, torch.Tensor) else torch.tensor(values, dtype=dtype)
    return host.pin_memory().to(device, non_blocking=True)


def deferrable(seqs: list[Sequence]) -> bool:
    """Whether these sequences' tokens can be sampled without the host: their logit
    processors read no earlier output token, and nothing they return needs a sync."""
    return all(
        s.sampling.logprobs is None
        and s.sampling.prompt_logprobs is None
        and not s.sampling.uses_penalties
        for s in seqs
    )


class PendingStep:
    """A launched step whose sampled tokens the host has not read yet.

    A step with structured output may not have sampled yet (`later`): its masks are
    being filled on the grammar thread while the host prepares the next step, and its
    tokens are drawn when that step first needs them (`device_tokens`, `tokens`)."""

    def __init__(
        self,
        seqs: list[Sequence],
        tokens: torch.Tensor | None = None,
        sample: Callable[[], torch.Tensor] | None = None,
    ) -> None:
        self.seqs = seqs  # sampled sequences, in the order of `device_tokens`
        self.positions = [s.num_tokens for s in seqs]  # where each token goes
        self._sample = sample
        self._device_tokens: torch.Tensor | None = None
        self._host_tokens: torch.Tensor | None = None
        self._ready: torch.cuda.Event | None = None  # recorded after the copy
        if tokens is not None:
            self._read_back(tokens)

    @classmethod
    def launch(cls, seqs: list[Sequence], tokens: torch.Tensor) -> PendingStep:
        """Start reading `tokens` back; call before the sequences get their placeholder."""
        return cls(seqs, tokens=tokens)

    @classmethod
    def later(cls, seqs: list[Sequence], sample: Callable[[], torch.Tensor]) -> PendingStep:
        """A step whose tokens `sample()` draws on first use; call before the sequences
        get their placeholder."""
        return cls(seqs, sample=sample)

    def _read_back(self, tokens: torch.Tensor) -> None:
        self._device_tokens = tokens
        if tokens.device.type != "cuda":
            self._host_tokens = tokens
            return
        host = torch.empty(tokens.shape, dtype=tokens.dtype, pin_memory=True)
        host.copy_(tokens, non_blocking=True)
        self._ready = torch.cuda.Event()
        self._ready.record()
        self._host_tokens = host

    def draw(self) -> None:
        """Sample a `later` step now (if not yet). Before the next forward pass is
        launched: the logits may be a CUDA graph's output buffer that it overwrites."""
        if self._device_tokens is None:
            assert self._sample is not None
            sample, self._sample = self._sample, None
            self._read_back(sample())

    @property
    def device_tokens(self) -> torch.Tensor:
        """[len(seqs)] int64 on the device (sampled now if not yet)."""
        self.draw()
        assert self._device_tokens is not None
        return self._device_tokens

    def index_of(self) -> dict[int, int]:
        """id(seq) -> row of its token in `device_tokens`."""
        return {id(s): i for i, s in enumerate(self.seqs)}

    def tokens(self) -> list[int]:
        """The sampled tokens on the host; waits for this step's copy only."""
        self.draw()
        if self._ready is not None:
            self._ready.synchronize()
        assert self._host_tokens is not None
        return self._host_tokens.tolist()


def placeholder_rows(
    seqs: list[Sequence], num_new: list[int], pending: PendingStep | None
) -> tuple[list[int], list[int]]:
    """(rows of the flat input ids that hold a placeholder, rows of `pending`'s tokens
    that replace them). A placeholder is always a sequence's last token."""
    dst: list[int] = []
    src: list[int] = []
    if pending is None:
        return dst, src
    index = None
    offset = 0
    for seq, n in zip(seqs, num_new, strict=True):
        if seq.token_ids[-1] == PLACEHOLDER and seq.num_computed_tokens + n == seq.num_tokens:
            if index is None:
                index = pending.index_of()
            dst.append(offset + n - 1)
            src.append(index[id(seq)])
        offset += n
    return dst, src


def patch_inputs(
    input_ids: torch.Tensor, pending: PendingStep, dst: list[int], src: list[int]
) -> None:
    """input_ids[dst] = pending's tokens[src], on the device (the host never waits)."""
    dev = input_ids.device
    tokens = pending.device_tokens.index_select(0, to_device(src, dev))
    input_ids.index_copy_(0, to_device(dst, dev), tokens)
