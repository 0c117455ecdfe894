"""`stator bench`: a light load generator for any OpenAI-compatible server.

It measures what users measure (TTFT, ITL, TPOT, end-to-end latency, throughput, goodput,
cache hit ratio) under fixed concurrency, request-rate arrivals, trace replay, multi-turn
sessions and sweeps, and writes per-request records, summaries and plots.
"""

from stator.bench.config import BenchConfig
from stator.bench.metrics import summarize
from stator.bench.runner import run_benchmark

__all__ = ["BenchConfig", "run_benchmark", "summarize"]
