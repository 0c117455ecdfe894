"""What to send: a list of `RequestSpec`s built from the config (synthetic lengths with
shared prefixes, or a Mooncake trace), before any request is sent."""

from __future__ import annotations

import json
import random
from pathlib import Path

import msgspec

from stator.bench.config import BenchConfig
from stator.bench.prompts import PromptSource


class RequestSpec(msgspec.Struct, kw_only=True):
    index: int
    prompt: str
    max_tokens: int
    input_tokens: int
    # Seconds after the start at which to send it (trace replay); None = as the load
    # shape decides.
    arrival: float | None = None
    warmup: bool = False


def _length(rng: random.Random, mean: float, std: float, lo: int = 1) -> int:
    if std <= 0:
        return max(lo, round(mean))
    return max(lo, round(rng.gauss(mean, std)))


def synthetic(
    cfg: BenchConfig, count: int, *, first_index: int = 0, salt: str = ""
) -> list[RequestSpec]:
    """`count` requests with ISL/OSL drawn from normal distributions; a `prefix_ratio`
    share of each prompt is one of `num_prefixes` shared prefixes."""
    source = PromptSource(cfg.seed, cfg.tokenizer)
    rng = random.Random(f"{cfg.seed}:lengths:{salt}")
    prefix_len = round(cfg.isl * cfg.prefix_ratio)
    prefixes = [source.text(prefix_len, f"prefix:{p}") for p in range(max(1, cfg.num_prefixes))]
    specs = []
    for i in range(count):
        index = first_index + i
        isl = _length(rng, cfg.isl, cfg.isl_std)
        osl = _length(rng, cfg.osl, cfg.osl_std)
        shared = min(prefix_len, isl)
        prompt = ""
        if shared:
            prompt = prefixes[rng.randrange(len(prefixes))]
        prompt += source.text(isl - shared, f"unique:{salt}:{index}")
        specs.append(RequestSpec(index=index, prompt=prompt, max_tokens=osl, input_tokens=isl))
    return specs


def load_trace(path: str | Path) -> list[dict]:
    rows = []
    with open(path) as f:
        for n, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            try:
                row = json.loads(line)
                int(row["input_length"]), int(row["output_length"])
            except (ValueError, KeyError, TypeError) as exc:
                raise ValueError(f"{path}:{n}: not a Mooncake trace row ({exc})") from exc
            rows.append(row)
    return rows


def from_trace(cfg: BenchConfig, rows: list[dict], limit: int | None = None) -> list[RequestSpec]:
    """Trace rows → requests at `timestamp` (ms) × time_scale, with prompts built from
    `hash_ids` blocks so that equal ids share content."""
    source = PromptSource(cfg.seed, cfg.tokenizer)
    rows = rows[:limit] if limit else rows
    t0 = min((r.get("timestamp", 0) for r in rows), default=0)
    specs = []
    for i, row in enumerate(rows):
        isl, osl = int(row["input_length"]), max(1, int(row["output_length"]))
        prompt = source.blocks(list(row.get("hash_ids", [])), cfg.trace_block_size, isl)
        arrival = (row.get("timestamp", 0) - t0) / 1000.0 * cfg.time_scale
        specs.append(
            RequestSpec(index=i, prompt=prompt, max_tokens=osl, input_tokens=isl, arrival=arrival)
        )
    return specs
