"""`PerfProfile`: what one worker can do, as measured by `stator profile`.

Prefill: TTFT (ms) of a lone prompt vs its length. Decode: the time of one decode step
(ms, i.e. the ITL) vs (batch size, context length per sequence). Each with the throughput
per GPU it implies. The file is JSON in the format the mocker's `--profile` reads
(`stator.engines.mocker.timing.ProfileTiming`), plus fields the planner uses; so a mocker
can be calibrated from a real GPU profile, and the planner sizes a fleet from either.

    {"version": 1, "engine": "native", "model": "...", "gpus_per_worker": 1,
     "max_num_seqs": 256, "max_kv_tokens": 1048576, "max_num_batched_tokens": 8192,
     "prefill": {"tokens": [...], "ms": [...], "tokens_per_s_per_gpu": [...]},
     "decode": {"batch_size": [...], "context": [...], "ms": [[...] per batch size],
                "tokens_per_s_per_gpu": [[...]], "feasible": [[...]]}}

`feasible[b][c]` is false where that batch of that context did not fit in the KV cache
during the sweep (its `ms` is then copied from the nearest smaller batch that fit, so the
mocker's table stays complete); the planner never picks such a cell.
"""

from __future__ import annotations

import bisect
import itertools
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


def interp(x: float, xs: list[float], ys: list[float]) -> float:
    """Piecewise-linear, clamped at both ends (as the mocker's profile timing)."""
    if x <= xs[0]:
        return ys[0]
    if x >= xs[-1]:
        return ys[-1]
    j = bisect.bisect_right(xs, x)
    x0, x1 = xs[j - 1], xs[j]
    return ys[j - 1] + (ys[j] - ys[j - 1]) * (x - x0) / (x1 - x0)


@dataclass
class PerfProfile:
    prefill_tokens: list[float]
    prefill_ms: list[float]
    batch_sizes: list[float]
    contexts: list[float]
    decode_ms: list[list[float]]  # [batch index][context index]
    feasible: list[list[bool]] | None = None
    engine: str = ""
    model: str = ""
    gpus_per_worker: int = 1
    max_num_seqs: int = 256
    max_kv_tokens: int = 0
    max_num_batched_tokens: int = 0
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.feasible is None:
            self.feasible = [[True] * len(self.contexts) for _ in self.batch_sizes]
        self.validate()

    def validate(self) -> None:
        for name, xs in (
            ("prefill.tokens", self.prefill_tokens),
            ("decode.batch_size", self.batch_sizes),
            ("decode.context", self.contexts),
        ):
            if not xs or any(b <= a for a, b in itertools.pairwise(xs)):
                raise ValueError(f"profile: {name} must be a non-empty, strictly increasing list")
        if len(self.prefill_ms) != len(self.prefill_tokens):
            raise ValueError("profile: prefill.ms must have one value per prefill.tokens entry")
        shape_ok = len(self.decode_ms) == len(self.batch_sizes) and all(
            len(row) == len(self.contexts) for row in self.decode_ms
        )
        if not shape_ok:
            raise ValueError("profile: decode.ms must be a batch_size × context table")
        if self.gpus_per_worker < 1:
            raise ValueError("profile: gpus_per_worker must be at least 1")

    # -- model -----------------------------------------------------------------------

    def ttft_ms(self, isl: float) -> float:
        """TTFT of a lone prompt of `isl` tokens."""
        return interp(isl, self.prefill_tokens, self.prefill_ms)

    def itl_ms(self, batch: float, context: float) -> float:
        """One decode step with `batch` sequences of `context` tokens each."""
        per_batch = [interp(context, self.contexts, row) for row in self.decode_ms]
        return interp(max(batch, 1.0), self.batch_sizes, per_batch)

    def prefill_tokens_per_s(self, isl: float) -> float:
        """Prompt tokens a worker prefills per second, prompts of `isl` back to back."""
        return isl / (self.ttft_ms(isl) / 1000.0)

    def max_batch(self, context: float) -> int:
        """The largest batch that fits: max_num_seqs, the KV cache, and the largest
        feasible batch measured at (about) this context."""
        limit = float(self.max_num_seqs)
        if self.max_kv_tokens:
            limit = min(limit, self.max_kv_tokens / max(context, 1.0))
        c = min(bisect.bisect_left(self.contexts, context), len(self.contexts) - 1)
        feasible = [b for b, row in zip(self.batch_sizes, self.feasible, strict=True) if row[c]]
        if feasible and max(feasible) < self.batch_sizes[-1]:
            limit = min(limit, max(feasible))
        return max(1, int(limit))

    def best_decode_batch(self, itl_target_ms: float, context: float) -> int | None:
        """The largest batch whose step time at `context` meets the ITL target (binary
        search, as Dynamo's planner); None when even one sequence misses it."""
        hi = self.max_batch(context)
        if self.itl_ms(1, context) > itl_target_ms:
            return None
        lo = 1
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if self.itl_ms(mid, context) <= itl_target_ms:
                lo = mid
            else:
                hi = mid - 1
        return lo

    # -- file ------------------------------------------------------------------------

    def to_json(self) -> dict[str, Any]:
        gpus = self.gpus_per_worker
        prefill_tput = [
            t / (ms / 1000) / gpus
            for t, ms in zip(self.prefill_tokens, self.prefill_ms, strict=True)
        ]
        decode_tput = [
            [b / (ms / 1000) / gpus if ms > 0 else math.inf for ms in row]
            for b, row in zip(self.batch_sizes, self.decode_ms, strict=True)
        ]
        return {
            "version": 1,
            "engine": self.engine,
            "model": self.model,
            "gpus_per_worker": gpus,
            "max_num_seqs": self.max_num_seqs,
            "max_kv_tokens": self.max_kv_tokens,
            "max_num_batched_tokens": self.max_num_batched_tokens,
            "prefill": {
                "tokens": self.prefill_tokens,
                "ms": self.prefill_ms,
                "tokens_per_s_per_gpu": prefill_tput,
            },
            "decode": {
                "batch_size": self.batch_sizes,
                "context": self.contexts,
                "ms": self.decode_ms,
                "tokens_per_s_per_gpu": decode_tput,
                "feasible": self.feasible,
            },
            **self.extra,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> PerfProfile:
        try:
            pre, dec = data["prefill"], data["decode"]
            known = {"version", "engine", "model", "gpus_per_worker", "max_num_seqs"}
            known |= {"max_kv_tokens", "max_num_batched_tokens", "prefill", "decode"}
            return cls(
                prefill_tokens=[float(v) for v in pre["tokens"]],
                prefill_ms=[float(v) for v in pre["ms"]],
                batch_sizes=[float(v) for v in dec["batch_size"]],
                contexts=[float(v) for v in dec["context"]],
                decode_ms=[[float(v) for v in row] for row in dec["ms"]],
                feasible=dec.get("feasible"),
                engine=data.get("engine", ""),
                model=data.get("model", ""),
                gpus_per_worker=int(data.get("gpus_per_worker", 1)),
                max_num_seqs=int(data.get("max_num_seqs", 256)),
                max_kv_tokens=int(data.get("max_kv_tokens", 0)),
                max_num_batched_tokens=int(data.get("max_num_batched_tokens", 0)),
                extra={k: v for k, v in data.items() if k not in known},
            )
        except (KeyError, TypeError) as exc:
            raise ValueError(f"profile: missing or malformed field: {exc}") from exc

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_json(), indent=1) + "\n")

    @classmethod
    def load(cls, path: str | Path) -> PerfProfile:
        try:
            data = json.loads(Path(path).read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise ValueError(f"cannot read profile {path}: {exc}") from exc
        return cls.from_json(data)
