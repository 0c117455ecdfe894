"""The server side of `native_gpu_http_vs_engine.py`: `stator run` in a subprocess, and
`stator bench`'s load generator against it at concurrency 256 (trace mode, every request
due at once, exact lengths), with each server process's CPU over the run."""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

from process_cpu import cpu_seconds, process_name, process_tree

REPO = Path(__file__).resolve().parents[1]
BUNDLED = REPO / "stator" / "models" / "tiny-chat"
CONCURRENCY = 256


def launch(args: list[str], log: Path, timeout: float = 400) -> tuple[subprocess.Popen, str]:
    """`stator run --port 0 <args>`, its output in `log`; (process, base URL) once it serves."""
    env = dict(os.environ, PYTHONPATH=f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    cmd = [sys.executable, "-m", "stator", "run", "--port", "0", *args]
    handle = log.open("wb")
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=handle, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        text = log.read_text(errors="replace")
        m = re.search(r"at (http://\S+)/v1", text)
        if m:
            return proc, m.group(1)
        if proc.poll() is not None:
            raise RuntimeError(f"stator run exited:\n{text[-3000:]}")
        time.sleep(0.5)
    proc.kill()
    raise TimeoutError(log.read_text(errors="replace")[-3000:])


def start_server(device: str, tiny: bool, mdir: Path, extra: list[str], log: Path):
    """`stator run` on `mdir` with `extra` flags, at most CONCURRENCY sequences; (process, base URL)."""
    args = ["--device", device, "--model", str(mdir), "--max-num-seqs", str(CONCURRENCY)]
    if not tiny:
        args += ["--load-format", "dummy", "--dtype", "bfloat16"]
    return launch(args + extra, log)


def http_bench(
    url: str,
    lengths: list[tuple[int, int]],
    server_pid: int,
    tmp: Path,
    tokenizer: Path = BUNDLED,
    first_id: int = 0,
) -> dict:
    """The prompts are made of `tokenizer`'s tokens: the served model's own, for exact lengths.
    Request i's prompt is block id first_id + i: a later serve on the same server with
    another first_id shares no prefix with the earlier one (no prefix-cache hits)."""
    from stator.bench.config import BenchConfig
    from stator.bench.runner import run_benchmark

    trace = tmp / "trace.jsonl"
    with trace.open("w") as f:
        for i, (isl, osl) in enumerate(lengths):  # a block id per request: no shared prefix
            f.write(
                json.dumps(
                    {
                        "timestamp": 0,
                        "input_length": isl,
                        "output_length": osl,
                        "hash_ids": [first_id + i],
                    }
                )
                + "\n"
            )
    cfg = BenchConfig(
        url=url,
        endpoint="completions",
        tokenizer=str(tokenizer),
        trace=str(trace),
        trace_block_size=1 << 20,
        max_concurrency=CONCURRENCY,
        num_requests=len(lengths),
        warmup=8,
        progress=False,
        plots=False,
    )
    pids = process_tree(server_pid)
    before, t0 = cpu_seconds(pids), time.perf_counter()
    summary = asyncio.run(run_benchmark(cfg)).points[0].summary
    after, wall = cpu_seconds(pids), time.perf_counter() - t0
    cpu = {
        f"{process_name(p)} ({p})": 100 * (after[p] - before[p]) / wall
        for p in after
        if p in before
    }
    return {
        "ok": summary["successful_requests"],
        "failed": summary["failed_requests"],
        "output_tok_s": summary["output_token_throughput"]["avg"],
        # stator bench's (and aiperf's) ITL: each request's mean gap (TPOT); `gap_*`: every
        # gap between two streamed chunks (vLLM bench's ITL: one token a chunk here).
        **{f"itl_{p}_ms": summary["inter_token_latency"].get(p) for p in ("p50", "p90", "p99")},
        **{f"gap_{p}_ms": summary["inter_chunk_latency"].get(p) for p in ("p50", "p90", "p99")},
        **{f"ttft_{p}_ms": summary["time_to_first_token"].get(p) for p in ("p50", "p90", "p99")},
        "client_cpu_per_request": summary.get("client_cpu_per_request"),
        "cpu_pct": cpu,
    }
