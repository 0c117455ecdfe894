"""Structured output in the native engine: per-sequence grammar matchers, their token
bitmasks filled on the host (in parallel, while the device runs the step's forward pass),
and the masks applied to the logits on the device, for constrained rows beside
unconstrained ones in one batch.

The fill runs on a thread of its own (`start_masks`): the grammar library releases the
GIL, so under `--overlap` the engine prepares the next step while a batch's masks are
computed, instead of after (at batch 64 the fill alone took 4.3-5.5 ms of a ~7.5 ms
step on an H100: `benchmarks/README.md`).
"""

from __future__ import annotations

import logging
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import torch

from stator.engines.base import EngineError
from stator.engines.native.overlap import PendingStep, to_device
from stator.engines.native.request import Sequence, Status
from stator.engines.native.sampler import Constrain, Sampler
from stator.protocols import GuidedDecoding
from stator.structured_output.grammar import InvalidGrammar, available
from stator.structured_output.matcher import GrammarCompiler

log = logging.getLogger(__name__)


class InvalidConstraint(EngineError):
    """A request's structured-output constraint does not compile (the caller's fault)."""

    def __init__(self, message: str, param: str) -> None:
        super().__init__(message)
        self.param = param


class Guidance:
    """The engine's grammar side: one compiler for the model's vocabulary, built at the
    first constrained request (reading a 128k vocabulary takes about a second)."""

    def __init__(
        self,
        model_dir: str | Path,
        vocab_size: int,
        eos_token_ids: list[int],
        device: torch.device,
        threads: int = 0,
    ) -> None:
        self.model_dir = Path(model_dir)
        self.threads = threads or None
        self.vocab_size = vocab_size
        self.eos_token_ids = list(eos_token_ids)
        self.device = device
        self.compiler: GrammarCompiler | None = None
        self._bits = torch.arange(32, dtype=torch.int32, device=device)
        # One thread: fills are started and joined in step order, never two at once.
        self._filler: ThreadPoolExecutor | None = None

    @property
    def available(self) -> bool:
        return available() and (self.model_dir / "tokenizer.json").is_file()

    def _compiler(self) -> GrammarCompiler | None:
        if self.compiler is None and self.available:
            self.compiler = GrammarCompiler.for_model(
                self.model_dir, self.vocab_size, self.eos_token_ids, self.threads
            )
        return self.compiler

    def attach(self, seq: Sequence, spec: GuidedDecoding | None) -> None:
        """Give `seq` a matcher for `spec`. Raises `InvalidConstraint` (400)."""
        if spec is None:
            return
        compiler = self._compiler()
        if compiler is None:
            raise InvalidConstraint(
                "this worker cannot constrain output (no llguidance or no tokenizer.json)",
                "response_format",
            )
        try:
            seq.matcher = compiler.matcher(spec)
        except InvalidGrammar as exc:
            raise InvalidConstraint(exc.message, exc.param) from None

    def masks(self, seqs: list[Sequence]) -> torch.Tensor | None:
        """[len(seqs), words] int32 bitmask on the device (every bit set for an
        unconstrained or finished row), or None when no row is constrained."""
        fill = self.start_masks(seqs)
        return None if fill is None else fill.result()

    def start_masks(self, seqs: list[Sequence]) -> MaskFill | None:
        """Start filling `masks(seqs)` on the grammar thread; None when no row is
        constrained. Until `result()` returns, these sequences' matchers belong to that
        thread: nothing may advance them."""
        rows = [
            (seq.matcher, i)
            for i, seq in enumerate(seqs)
            if seq.matcher is not None and seq.status is not Status.FINISHED
        ]
        if not rows or self.compiler is None:
            return None
        words = self.compiler.words
        pin = self.device.type == "cuda"
        host = torch.empty((len(seqs), words), dtype=torch.int32, pin_memory=pin)
        if len(rows) < len(seqs):  # the fill writes only the constrained rows
            constrained = {i for _, i in rows}
            host[[i for i in range(len(seqs)) if i not in constrained]] = -1
        if self._filler is None:
            self._filler = ThreadPoolExecutor(1, thread_name_prefix="grammar-masks")
        job = self._filler.submit(self.compiler.fill, rows, host.data_ptr(), len(seqs))
        return MaskFill(job, host, self.device)

    def constraint(self, seqs: list[Sequence]) -> Constrain | None:
        """The sampler's `constrain` for these rows (masks filled now, while the device
        computes the logits), or None when no row is constrained."""
        masks = self.masks(seqs)
        if masks is None:
            return None
        return lambda logits, guard: self.apply(logits, masks, guard)

    def launch_sampling(
        self, sampler: Sampler, logits: torch.Tensor, seqs: list[Sequence]
    ) -> PendingStep:
        """A deferred (overlapped) step's sampling. With structured output the tokens are
        drawn when the next step first needs them, so the masks fill on the grammar thread
        while the host prepares that step (min_tokens counts output tokens: such rows
        draw now)."""
        eager = any(s.num_output_tokens < s.sampling.min_tokens for s in seqs)
        fill = None if eager else self.start_masks(seqs)
        if fill is None:
            return PendingStep.launch(
                seqs, sampler.sample_tokens(logits, seqs, self.constraint(seqs))
            )
        ready = fill

        def constrain(rows: torch.Tensor, guard: bool) -> torch.Tensor:
            return self.apply(rows, ready.result(), guard)

        return PendingStep.later(seqs, lambda: sampler.sample_tokens(logits, seqs, constrain))

    def apply(self, logits: torch.Tensor, masks: torch.Tensor, guard: bool) -> torch.Tensor:
        """`logits` [N, V] with every token the masks forbid at -inf (a new tensor).
        `guard`: some row may have had its allowed tokens pushed to -inf already."""
        n, vocab = logits.shape
        allowed = ((masks[:, :, None] >> self._bits) & 1).view(n, -1)[:, :vocab].bool()
        if allowed.shape[1] < vocab:  # logits wider than the mask: padding tokens
            pad = torch.zeros(n, vocab - allowed.shape[1], dtype=torch.bool, device=logits.device)
            allowed = torch.cat([allowed, pad], dim=1)
        masked = logits.masked_fill(~allowed, float("-inf"))
        if not guard:
            return masked
        # A row left with nothing (min_tokens or a bias against the only allowed tokens)
        # falls back to the grammar alone: the constraint wins.
        dead = torch.isneginf(masked.amax(dim=-1, keepdim=True))
        fallback = torch.zeros_like(logits).masked_fill(~allowed, float("-inf"))
        return torch.where(dead, fallback, masked)

    def accept(self, seq: Sequence, token: int) -> str | None:
        """Advance `seq`'s matcher by `token`; an error message when it cannot."""
        matcher = seq.matcher
        if matcher is None or matcher.is_stopped():
            return None
        if matcher.consume_token(token):
            return None
        return f"token {token} breaks the structured-output constraint: {matcher.get_error()}"


class MaskFill:
    """A batch's bitmask being filled on the grammar thread, into pinned host memory."""

    def __init__(self, job: Future, host: torch.Tensor, device: torch.device) -> None:
        self._job = job
        self._host = host
        self._device = device
        self._masks: torch.Tensor | None = None

    def result(self) -> torch.Tensor:
        """The masks on the device (waits for the fill; the copy does not block)."""
        if self._masks is None:
            self._job.result()
            self._masks = to_device(self._host, self._device, torch.int32)
        return self._masks
