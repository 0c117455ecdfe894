"""`frontend_overhead.py --processes`: stator's frontend process against Dynamo 1.6.1's, each
in front of one mocker worker process at speedup 100 (see frontend_overhead.py's docstring).
The servers are mocker_fidelity.py's; the client is `stator bench run`, the lightest we
have, one run per concurrency, its process not counted."""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import aiohttp
from mocker_fidelity import (
    Prompts,
    Server,
    Workload,
    dynamo_server,
    run_in_process,
    stator_env,
    stator_procs_server,
)
from tokenizers import Tokenizer

from tests.model_factory import make_model_dir

SERVERS = {"procs": ("stator frontend", stator_procs_server), "dynamo": ("dynamo", dynamo_server)}


def bench(url: str, model_dir: Path, requests: int, concurrency: int, seed: int) -> dict:
    """One `stator bench run` (the lightest client we have); its summary point."""
    with tempfile.TemporaryDirectory() as out:
        cmd = [sys.executable, "-m", "stator", "bench", "run", "--url", url, "--model", "tiny",
               "--tokenizer", str(model_dir), "--isl", "512", "--osl", "64",
               "--concurrency", str(concurrency), "--num-requests", str(requests),
               "--seed", str(seed), "--no-progress", "--no-plots", "--out", out]  # fmt: skip
        subprocess.run(cmd, env=stator_env(), check=True, stdout=subprocess.DEVNULL)
        return json.loads((Path(out) / "summary.json").read_text())["points"][0]


async def wait_ready(server: Server) -> None:
    async with aiohttp.ClientSession() as session:
        await server.wait_ready(session)


def measure(key: str, args, model_dir: Path, run_dir: Path) -> dict[int, dict]:
    """Start one system, load it at each concurrency; per concurrency: CPU and the summary."""
    server = SERVERS[key][1](args, model_dir, run_dir)
    out = {}
    try:
        asyncio.run(wait_ready(server))
        bench(server.url, model_dir, 64, 8, seed=1)  # warm up
        for c in args.concurrency:
            before = server.cpu()
            point = bench(server.url, model_dir, args.requests, c, seed=1000 + c)
            after = server.cpu()
            cpu = {k: (after[k] - before[k]) / args.requests for k in after}
            out[c] = {"cpu": cpu, "point": point}
    finally:
        server.stop()
    return out


def compare_processes(args: argparse.Namespace) -> None:
    args.num_gpu_blocks, args.block_size = 16384, 64  # Dynamo's mocker defaults
    work = Path(tempfile.mkdtemp(prefix="frontend-procs-"))
    model_dir = make_model_dir(work / "tiny", max_position_embeddings=32768)
    runs = []
    for k, key in enumerate(args.systems.split(",")):
        run_dir = work / f"{k + 1}-{key}"
        run_dir.mkdir()
        runs.append((f"{SERVERS[key][0]} #{k + 1}", measure(key, args, model_dir, run_dir)))
    # The engine's own TTFT: stator's mocker through the Engine API, same prompt length and
    # concurrency, no HTTP and no transport.
    prompts = Prompts(Tokenizer.from_file(str(model_dir / "tokenizer.json")), seed=11)
    loads = [
        Workload(f"c={c}", c, [prompts.text(args.input_tokens) for _ in range(args.requests)])
        for c in args.concurrency
    ]
    engine, _ = asyncio.run(run_in_process(args, model_dir, loads))
    print(f"(run directories under {work})", file=sys.stderr)

    print("| system (run order) | concurrency | frontend CPU ms/request | mocker CPU ms/request "
          "| req/s | client TTFT p50 ms | engine TTFT p50 ms | added TTFT p50 ms | ITL p50 ms |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|")
    for w in loads:
        engine_ttft = 1000 * statistics.median(r.ttft for r in engine[w.name])
        for label, result in runs:
            cpu, point = result[w.concurrency]["cpu"], result[w.concurrency]["point"]
            ttft = point["time_to_first_token"]["p50"]
            row = [label, w.concurrency, 1000 * cpu["frontend"], 1000 * cpu["mocker"],
                   point["request_throughput"]["avg"], ttft, engine_ttft, ttft - engine_ttft,
                   point["inter_token_latency"]["p50"]]  # fmt: skip
            print("| " + " | ".join(f"{v:.2f}" if isinstance(v, float) else str(v)
                                    for v in row) + " |")  # fmt: skip
