"""The profiler: sweep one engine (any: native, vllm, the mocker for tests) in this
process and measure what the planner needs (`PerfProfile`).

- Prefill: for each prompt length, `repeats` lone requests of fresh random tokens (no
  prefix cache hit) with max_tokens 1; the median time to the first output is the TTFT.
- Decode: for each (batch, context), `batch` requests of `context`-token prompts at once,
  each generating `decode_steps` tokens; the step time is the median gap between outputs
  while every request of the batch is decoding (after the last first token, before the
  first last token). A batch that does not fit in the KV cache or in max_num_seqs is
  marked infeasible.

The engine is driven directly (no HTTP, no router), so the numbers are the engine's own;
the frontend's few ms per request are left to the planner's margin.
"""

from __future__ import annotations

import asyncio
import logging
import random
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

from stator.config import option
from stator.engines.base import Engine
from stator.planner.profile import PerfProfile
from stator.protocols import EngineRequest, SamplingOptions, StopConditions

log = logging.getLogger(__name__)


@dataclass
class ProfileConfig:
    isl: list[int] = option(
        [128, 512, 1024, 2048, 4096, 8192], "Prompt lengths of the prefill sweep"
    )
    batch_sizes: list[int] = option([1, 4, 16, 64, 128], "Batch sizes of the decode sweep")
    contexts: list[int] = option([256, 1024, 4096], "Context lengths of the decode sweep")
    decode_steps: int = option(24, "Tokens each request of a decode measurement generates")
    repeats: int = option(3, "Prefill measurements per prompt length (the median is kept)")
    gpus_per_worker: int = option(1, "GPUs one worker uses (throughput is reported per GPU)")
    output: str = option("profile.json", "Where to write the profile (JSON)", metavar="FILE")
    plot: str | None = option(
        None, "Where to draw the curves (PNG; default: the output with .png)", metavar="FILE"
    )
    seed: int = option(0, "Seed of the random prompts")

    def validate(self) -> None:
        for name in ("isl", "batch_sizes", "contexts"):
            values = getattr(self, name)
            if not values or any(v <= 0 for v in values):
                raise ValueError(f"--{name.replace('_', '-')} must list positive numbers")
            if sorted(set(values)) != list(values):
                raise ValueError(f"--{name.replace('_', '-')} must be strictly increasing")
        if self.decode_steps < 4:
            raise ValueError("--decode-steps must be at least 4")
        if self.repeats < 1 or self.gpus_per_worker < 1:
            raise ValueError("--repeats and --gpus-per-worker must be at least 1")


class Profiler:
    def __init__(self, engine: Engine, config: ProfileConfig, vocab_size: int = 32000) -> None:
        self.engine = engine
        self.config = config
        self.card = engine.model_card()
        self.rng = random.Random(config.seed)
        # Ids away from 0 (often special tokens) and inside every vocabulary we meet.
        self.token_range = (10, max(11, min(vocab_size, 32000) - 1))
        self._ids = 0

    def _prompt(self, length: int) -> list[int]:
        lo, hi = self.token_range
        return [self.rng.randrange(lo, hi) for _ in range(length)]

    def _request(self, length: int, max_tokens: int) -> EngineRequest:
        self._ids += 1
        return EngineRequest(
            request_id=f"profile-{self._ids}",
            model=self.card.name,
            token_ids=self._prompt(length),
            sampling=SamplingOptions(temperature=0.0),
            stop=StopConditions(max_tokens=max_tokens, ignore_eos=True),
        )

    async def _times(self, request: EngineRequest, start: float) -> list[tuple[float, int]]:
        """(arrival time in s after `start`, tokens so far) of every output with tokens.
        An engine may send several tokens in one output (the mocker catching up)."""
        times: list[tuple[float, int]] = []
        tokens = 0
        async for output in self.engine.generate(request):
            if output.token_ids:
                tokens += len(output.token_ids)
                times.append((time.perf_counter() - start, tokens))
            if output.finish_reason == "error":
                raise RuntimeError(f"engine failed a profiling request: {output.error}")
        return times

    async def prefill_ms(self, isl: int) -> float:
        samples = []
        for _ in range(self.config.repeats):
            request = self._request(isl, 1)
            start = time.perf_counter()
            times = await self._times(request, start)
            samples.append(times[0][0] * 1000)
        return statistics.median(samples)

    def fits(self, batch: int, context: int) -> bool:
        card = self.card
        kv_tokens = card.total_kv_blocks * card.kv_block_size
        need = batch * (context + self.config.decode_steps + card.kv_block_size)
        return batch <= card.max_num_seqs and (not kv_tokens or need <= kv_tokens)

    async def decode_ms(self, batch: int, context: int) -> float:
        steps = self.config.decode_steps
        requests = [self._request(context, steps) for _ in range(batch)]
        start = time.perf_counter()
        runs = await asyncio.gather(*(self._times(r, start) for r in requests))
        # The window where every request of the batch is decoding.
        window_start = max(t[0][0] for t in runs)
        window_end = min(t[-1][0] for t in runs)
        per_token = []
        for t in runs:
            inside = [p for p in t if window_start <= p[0] <= window_end]
            if len(inside) < 2:
                inside = t[1:]  # no common window (tiny batches): after the first token
            if len(inside) >= 2 and inside[-1][1] > inside[0][1]:
                (t0, n0), (t1, n1) = inside[0], inside[-1]
                per_token.append((t1 - t0) / (n1 - n0))
        if not per_token:
            raise RuntimeError(f"decode batch {batch} context {context}: too few tokens timed")
        return statistics.median(per_token) * 1000

    async def run(self) -> PerfProfile:
        config = self.config
        # Warm up (first-call costs: CUDA graphs, allocator).
        await self._times(self._request(config.isl[0], 2), time.perf_counter())
        prefill = []
        for isl in config.isl:
            ms = await self.prefill_ms(isl)
            log.info("prefill %6d tokens: TTFT %.2f ms", isl, ms)
            prefill.append(ms)
        table: list[list[float]] = []
        feasible: list[list[bool]] = []
        for b, batch in enumerate(config.batch_sizes):
            row, ok = [], []
            for c, context in enumerate(config.contexts):
                if self.fits(batch, context):
                    ms = await self.decode_ms(batch, context)
                    log.info("decode batch %4d context %6d: ITL %.2f ms", batch, context, ms)
                    row.append(ms)
                    ok.append(True)
                else:
                    # Not measurable here: keep the table complete for the mocker with
                    # the nearest smaller batch's time (or, for the first row, inf-free 0).
                    row.append(table[b - 1][c] if b else 0.0)
                    ok.append(False)
            table.append(row)
            feasible.append(ok)
        card = self.card
        return PerfProfile(
            prefill_tokens=[float(v) for v in config.isl],
            prefill_ms=prefill,
            batch_sizes=[float(v) for v in config.batch_sizes],
            contexts=[float(v) for v in config.contexts],
            decode_ms=table,
            feasible=feasible,
            engine=card.engine,
            model=card.name,
            gpus_per_worker=config.gpus_per_worker,
            max_num_seqs=card.max_num_seqs,
            max_kv_tokens=card.total_kv_blocks * card.kv_block_size,
            max_num_batched_tokens=card.max_num_batched_tokens,
        )


def plot_profile(profile: PerfProfile, path: str | Path) -> None:
    """Three panels: TTFT vs ISL, ITL vs batch (one line per context), decode tokens/s
    per GPU vs batch."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    data = profile.to_json()
    fig, (a, b, c) = plt.subplots(1, 3, figsize=(15, 4.2))
    a.plot(profile.prefill_tokens, profile.prefill_ms, "o-")
    a.set(xlabel="prompt tokens (ISL)", ylabel="TTFT (ms)", title="prefill")
    a2 = a.twinx()
    a2.plot(profile.prefill_tokens, data["prefill"]["tokens_per_s_per_gpu"], "s--", color="C1")
    a2.set_ylabel("prefill tokens/s per GPU", color="C1")
    for j, context in enumerate(profile.contexts):
        rows = [i for i in range(len(profile.batch_sizes)) if profile.feasible[i][j]]
        xs = [profile.batch_sizes[i] for i in rows]
        ys = [profile.decode_ms[i][j] for i in rows]
        tput = [data["decode"]["tokens_per_s_per_gpu"][i][j] for i in rows]
        b.plot(xs, ys, "o-", label=f"context {int(context)}")
        c.plot(xs, tput, "o-", label=f"context {int(context)}")
    b.set(xlabel="batch size", ylabel="ITL (ms)", title="decode step", xscale="log")
    c.set(xlabel="batch size", ylabel="decode tokens/s per GPU", title="decode throughput")
    c.set_xscale("log")
    b.legend()
    c.legend()
    fig.suptitle(f"{profile.model} ({profile.engine}, {profile.gpus_per_worker} GPU/worker)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
