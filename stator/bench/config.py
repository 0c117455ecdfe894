"""Flags of `stator bench run` (the config idiom of stator.config)."""

from __future__ import annotations

from dataclasses import dataclass

from stator.config import option


@dataclass
class BenchConfig:
    url: str = option("http://127.0.0.1:8000", "Base URL of the OpenAI-compatible server")
    model: str | None = option(None, "Model name (default: the first of GET /v1/models)")
    endpoint: str = option("chat", "API to call", choices=["chat", "completions"])
    stream: bool = option(True, "Stream responses (needed for TTFT/ITL)")
    # load shape
    concurrency: int = option(8, "Requests in flight at most (the whole load in closed-loop mode)")
    request_rate: float | None = option(None, "Arrivals per second (open loop); None = closed loop")
    arrival: str = option(
        "poisson", "Arrival process for --request-rate", choices=["poisson", "constant", "gamma"]
    )
    max_concurrency: int | None = option(
        None, "Cap on requests in flight in open-loop modes (rate, trace); None = no cap"
    )
    burstiness: float = option(1.0, "Gamma shape for --arrival gamma (<1 burstier, 1 = Poisson)")
    sweep: list[float] = option([], "Comma list of concurrencies (or rates with --request-rate)")
    trace: str | None = option(None, "Mooncake-format JSONL trace to replay at its timestamps")
    trace_block_size: int = option(512, "Tokens per hash id in --trace")
    time_scale: float = option(1.0, "Multiply trace timestamps by this (0.5 = twice as fast)")
    sessions: int = option(0, "Multi-turn mode: number of conversations (0 = off)")
    turns: int = option(3, "Turns per conversation in multi-turn mode")
    # workload
    num_requests: int = option(200, "Measured requests (per sweep point)")
    warmup: int = option(0, "Warm-up requests sent first and excluded from the results")
    isl: int = option(512, "Mean input length in tokens")
    isl_std: float = option(0.0, "Standard deviation of the input length")
    osl: int = option(64, "Mean output length in tokens")
    osl_std: float = option(0.0, "Standard deviation of the output length")
    prefix_ratio: float = option(0.0, "Fraction of each prompt that is a shared prefix")
    num_prefixes: int = option(1, "Number of distinct shared prefixes")
    tokenizer: str | None = option(None, "Model dir with tokenizer.json: exact prompt lengths")
    seed: int = option(0, "Seed: the same seed gives the same prompts on any server")
    ignore_eos: bool = option(True, "Send ignore_eos and min_tokens so lengths are controlled")
    slo: str | None = option(None, "Goodput SLOs, e.g. ttft=200ms,itl=25ms,e2e=2s")
    timeout: float = option(600.0, "Seconds before one request is abandoned")
    api_key: str | None = option(
        None, "Sent as `Authorization: Bearer KEY` (servers that require an API key)"
    )
    ready_check_timeout_sec: float = option(
        0.0,
        "Before any request, wait up to this many seconds for GET /health to answer 200 and "
        "GET /v1/models to list the model (0 = do not wait)",
    )
    # output
    out: str | None = option(None, "Directory for records.jsonl, summary.json/csv and plots")
    tag: str | None = option(None, "Name of this run in reports (default: the URL)")
    progress: bool = option(True, "Show a live progress bar")
    plots: bool = option(True, "Draw PNG plots into --out")
