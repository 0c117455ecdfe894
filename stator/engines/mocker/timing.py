"""How long a simulated engine step takes.

A step costs prefill time for the new prompt tokens it computes (when it computes any)
plus decode time when it advances decoding sequences. A step with only prefill work has no
decode part (measured against Dynamo 1.6.1: a lone 64-, 512- or 2048-token prompt's TTFT
is the prefill polynomial alone plus the frontend's overhead). Prefill workers never have
a decode part. The prefill part is divided by the speedup
ratio, the decode part by speedup × decode speedup; a ratio of 0 makes every step free.

Two models:
- `PolynomialTiming` (the default): Dynamo's fitted curves. Prefill ms is a quadratic in
  the new tokens of the step; decode ms is a quadratic in the decoding sequences' share of
  the KV cache, at least 1 ms. That share counts their tokens (prompt + generated), not the
  blocks held, and leaves out sequences still prefilling: measured against Dynamo 1.6.1
  (8 decoding 65-token prompts: ITL 8.2 ms, the token count predicts 8.3 and the block
  count 9.0; a 1024-token prefill beside one decoding sequence adds only that sequence's
  decode time). Using the same curves keeps our latencies comparable with Dynamo's mocker.
- `ProfileTiming`: measured tables from a JSON file, e.g. a profile of our native engine
  on a GPU. Prefill ms is interpolated over tokens; decode ms bilinearly over (batch size,
  mean context length). Values outside the table are clamped to its edges.

Profile file format:
    {"prefill": {"tokens": [128, 512, ...], "ms": [9.1, 20.3, ...]},
     "decode": {"batch_size": [1, 8, ...], "context": [512, 2048, ...],
                "ms": [[row for batch 1 over contexts], [row for batch 8], ...]}}
"""

from __future__ import annotations

import bisect
import itertools
import json
from dataclasses import dataclass
from pathlib import Path

from stator.engines.mocker.scheduler import ScheduledStep


@dataclass(frozen=True, slots=True)
class StepShape:
    """The facts about a step the timing models look at."""

    prefill_tokens: int
    num_decode: int
    decode_context: int  # sum of the decoding sequences' lengths
    total_kv_tokens: int  # the cache's capacity: blocks × block size

    @classmethod
    def of(cls, step: ScheduledStep, total_kv_tokens: int) -> StepShape:
        return cls(step.prefill_tokens, step.num_decode, step.decode_context, total_kv_tokens)


class PolynomialTiming:
    """Dynamo's default mocker model (times in milliseconds)."""

    def prefill_ms(self, shape: StepShape) -> float:
        n = shape.prefill_tokens
        return 4.209989e-7 * n * n + 1.518344e-2 * n + 16.50142

    def decode_ms(self, shape: StepShape) -> float:
        total = shape.total_kv_tokens
        u = shape.decode_context / total if total else 0.0
        return max(1.0, -25.74 * u * u + 54.01 * u + 5.74)


def _interp(x: float, xs: list[float], ys: list[float]) -> float:
    """Piecewise-linear interpolation, clamped at both ends."""
    if x <= xs[0]:
        return ys[0]
    if x >= xs[-1]:
        return ys[-1]
    j = bisect.bisect_right(xs, x)
    x0, x1 = xs[j - 1], xs[j]
    return ys[j - 1] + (ys[j] - ys[j - 1]) * (x - x0) / (x1 - x0)


def _ascending(name: str, values: list[float]) -> list[float]:
    if not values or any(b <= a for a, b in itertools.pairwise(values)):
        raise ValueError(f"profile: {name} must be a non-empty, strictly increasing list")
    return [float(v) for v in values]


class ProfileTiming:
    """Interpolated tables (times in milliseconds)."""

    def __init__(self, data: dict) -> None:
        try:
            pre, dec = data["prefill"], data["decode"]
            self.prefill_tokens = _ascending("prefill.tokens", pre["tokens"])
            self.prefill_values = [float(v) for v in pre["ms"]]
            self.batch_sizes = _ascending("decode.batch_size", dec["batch_size"])
            self.contexts = _ascending("decode.context", dec["context"])
            self.decode_table = [[float(v) for v in row] for row in dec["ms"]]
        except (KeyError, TypeError) as exc:
            raise ValueError(f"profile: missing or malformed field: {exc}") from exc
        if len(self.prefill_values) != len(self.prefill_tokens):
            raise ValueError("profile: prefill.ms must have one value per prefill.tokens entry")
        if len(self.decode_table) != len(self.batch_sizes) or any(
            len(row) != len(self.contexts) for row in self.decode_table
        ):
            raise ValueError("profile: decode.ms must be a batch_size × context table")

    @classmethod
    def from_file(cls, path: str | Path) -> ProfileTiming:
        try:
            data = json.loads(Path(path).read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise ValueError(f"cannot read timing profile {path}: {exc}") from exc
        return cls(data)

    def prefill_ms(self, shape: StepShape) -> float:
        return _interp(shape.prefill_tokens, self.prefill_tokens, self.prefill_values)

    def decode_ms(self, shape: StepShape) -> float:
        batch = max(shape.num_decode, 1)
        context = shape.decode_context / batch if shape.num_decode else self.contexts[0]
        per_batch = [_interp(context, self.contexts, row) for row in self.decode_table]
        return _interp(batch, self.batch_sizes, per_batch)


class StepTimer:
    """Seconds a step takes, from a model, the speedups and the worker's role."""

    def __init__(
        self,
        model: PolynomialTiming | ProfileTiming | None = None,
        *,
        speedup_ratio: float = 1.0,
        decode_speedup_ratio: float = 1.0,
        prefill_only: bool = False,
    ) -> None:
        self.model = model or PolynomialTiming()
        self.speedup_ratio = speedup_ratio
        self.decode_speedup_ratio = decode_speedup_ratio
        self.prefill_only = prefill_only

    def step_seconds(self, shape: StepShape) -> float:
        # Unlike Dynamo 1.6.1 (where a ratio of 0 silently means 1), 0 really is instant.
        if self.speedup_ratio <= 0:
            return 0.0
        ms = 0.0
        if shape.prefill_tokens:
            ms += self.model.prefill_ms(shape) / self.speedup_ratio
        if shape.num_decode and not self.prefill_only and self.decode_speedup_ratio > 0:
            ms += self.model.decode_ms(shape) / (self.speedup_ratio * self.decode_speedup_ratio)
        return ms / 1000.0
