"""From per-request records to the numbers users compare (pure functions).

Names and units follow aiperf's summary export where the metric exists there
(`time_to_first_token`, `inter_token_latency`, `request_latency`, ... in ms), so existing
dashboards and scripts can read our JSON.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Sequence

from stator.bench.client import RequestRecord

_UNITS = {"ms": 1e-3, "s": 1.0, "us": 1e-6}
SLO_METRICS = {"ttft", "itl", "tpot", "e2e", "ttst"}


def parse_slos(text: str | None) -> dict[str, float]:
    """`ttft=200ms,itl=25ms,e2e=2s` → {"ttft": 0.2, "itl": 0.025, "e2e": 2.0} (seconds)."""
    slos: dict[str, float] = {}
    if not text:
        return slos
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        m = re.fullmatch(r"(\w+)\s*[=:]\s*([0-9.]+)\s*(ms|s|us)?", part)
        if not m or m.group(1) not in SLO_METRICS:
            raise ValueError(
                f"bad SLO {part!r}: use NAME=VALUE[ms|s|us] with NAME in {sorted(SLO_METRICS)}"
            )
        slos[m.group(1)] = float(m.group(2)) * _UNITS[m.group(3) or "ms"]
    return slos


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """Linear-interpolated percentile of already sorted values (numpy's default)."""
    if not sorted_values:
        return math.nan
    pos = (len(sorted_values) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


def stats(values: Sequence[float], unit: str, scale: float = 1.0) -> dict[str, float | str]:
    """avg/min/max/std/p50/p90/p99 (and p25/p75) of `values` × scale."""
    v = sorted(x * scale for x in values)
    out: dict[str, float | str] = {"unit": unit, "count": len(v)}
    if not v:
        return out
    mean = sum(v) / len(v)
    out.update(
        avg=mean,
        min=v[0],
        max=v[-1],
        std=math.sqrt(sum((x - mean) ** 2 for x in v) / len(v)),
        p25=percentile(v, 25),
        p50=percentile(v, 50),
        p75=percentile(v, 75),
        p90=percentile(v, 90),
        p99=percentile(v, 99),
    )
    return out


def tpot(r: RequestRecord) -> float | None:
    """Mean time per output token after the first (aiperf's per-request ITL)."""
    if r.ttft is None or r.latency is None or r.output_tokens < 2:
        return None
    return (r.latency - r.ttft) / (r.output_tokens - 1)


def meets(r: RequestRecord, slos: dict[str, float]) -> bool:
    if not r.ok:
        return False
    values = {"ttft": r.ttft, "e2e": r.latency, "ttst": r.ttst, "itl": tpot(r), "tpot": tpot(r)}
    for name, limit in slos.items():
        value = values[name]
        if value is not None and value > limit:
            return False
        if value is None and name in ("ttft", "e2e"):
            return False
    return True


def summarize(
    records: Sequence[RequestRecord], duration: float, slos: dict[str, float] | None = None
) -> dict:
    """The summary of one run (one load point)."""
    ok = [r for r in records if r.ok]
    failed = [r for r in records if not r.ok]
    gaps = [b - a for r in ok for a, b in zip(r.chunk_times, r.chunk_times[1:], strict=False)]
    per_user = []
    for r in ok:
        if r.latency and r.output_tokens:
            per_user.append(r.output_tokens / r.latency)
    out_tokens = sum(r.output_tokens for r in ok)
    in_tokens = sum(r.input_tokens for r in ok)
    cached = sum(r.cached_tokens for r in ok)
    duration = max(duration, 1e-9)
    summary: dict = {
        "request_count": len(records),
        "successful_requests": len(ok),
        "failed_requests": len(failed),
        "errors_by_status": dict(Counter(str(r.status) for r in failed)),
        "benchmark_duration": {"unit": "s", "avg": duration},
        "time_to_first_token": stats([r.ttft for r in ok if r.ttft is not None], "ms", 1e3),
        "time_to_second_token": stats([r.ttst for r in ok if r.ttst is not None], "ms", 1e3),
        "inter_token_latency": stats([t for r in ok if (t := tpot(r)) is not None], "ms", 1e3),
        "inter_chunk_latency": stats(gaps, "ms", 1e3),
        "request_latency": stats([r.latency for r in ok if r.latency is not None], "ms", 1e3),
        "input_sequence_length": stats([r.input_tokens for r in ok], "tokens"),
        "output_sequence_length": stats([r.output_tokens for r in ok], "tokens"),
        "output_token_throughput_per_user": stats(per_user, "tokens/sec/user"),
        "request_throughput": {"unit": "requests/sec", "avg": len(ok) / duration},
        "output_token_throughput": {"unit": "tokens/sec", "avg": out_tokens / duration},
        "total_token_throughput": {
            "unit": "tokens/sec",
            "avg": (in_tokens + out_tokens) / duration,
        },
        "cached_token_ratio": {"unit": "ratio", "avg": cached / in_tokens if in_tokens else 0.0},
    }
    if slos:
        good = sum(1 for r in records if meets(r, slos))
        summary["goodput"] = {
            "unit": "requests/sec",
            "avg": good / duration,
            "good_requests": good,
            "fraction": good / len(records) if records else 0.0,
            "slos_seconds": slos,
        }
    return summary


def client_cpu(user_s: float, system_s: float, requests: int) -> dict:
    """The benchmark client's own CPU time per request over a load point (its whole
    process: the event loop, parsing, bookkeeping and the progress bar), in ms. Far below
    the server's cost per request, the client is not what limits the measurement."""
    n = max(requests, 1)
    return {
        "unit": "ms",
        "avg": 1e3 * (user_s + system_s) / n,
        "user": 1e3 * user_s / n,
        "system": 1e3 * system_s / n,
    }
