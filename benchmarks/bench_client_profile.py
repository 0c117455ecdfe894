"""Profile `stator bench`'s client in-process: the server (`stator run --engine mocker`)
in its own process, the client's closed loop run here, its CPU time (getrusage of this
process) taken over the measured requests alone, after prompts are built and a warm-up.
Optionally under cProfile (`--profile`: the top functions by own time) or on asyncio's
event loop instead of uvloop (`--asyncio`), to see where the client's time goes.

    flock /work/bench.lock python benchmarks/bench_client_profile.py --requests 800 --concurrency 8 --repeats 3
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import os
import pstats
import resource
import tempfile
import time
from pathlib import Path

from bench_client_cost import mocker_server

from stator.bench.config import BenchConfig
from stator.bench.http import HttpClient
from stator.bench.runner import _Sender, closed_loop, loop_factory
from stator.bench.workload import synthetic
from tests.model_factory import make_model_dir


async def measure(args, url: str, model_dir: Path, seed: int) -> None:
    cfg = BenchConfig(url=url, model="tiny", tokenizer=str(model_dir), seed=seed)
    specs = synthetic(cfg, args.requests, salt="measured")
    warm = synthetic(cfg, args.concurrency, salt="warmup")
    http = HttpClient(url)
    try:
        sender = _Sender(http, cfg, "tiny")
        await closed_loop(sender, warm, args.concurrency, lambda n: None)
        profile = cProfile.Profile() if args.profile else None
        before, start = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
        if profile:
            profile.enable()
        records = await closed_loop(sender, specs, args.concurrency, lambda n: None)
        if profile:
            profile.disable()
        after, wall = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter() - start
    finally:
        http.close()
    n = len(records)
    user, system = after.ru_utime - before.ru_utime, after.ru_stime - before.ru_stime
    events = sum(len(r.chunk_times) for r in records) / n
    print(f"c={args.concurrency} requests={n} ok={sum(r.ok for r in records)} "
          f"client CPU ms/request={1e3 * (user + system) / n:.3f} (user {1e3 * user / n:.3f}, "
          f"system {1e3 * system / n:.3f}) req/s={n / wall:.1f} "
          f"output events/request={events:.1f}", flush=True)  # fmt: skip
    if profile:
        pstats.Stats(profile).sort_stats("tottime").print_stats(25)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=800)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--speedup-ratio", type=float, default=100.0)
    parser.add_argument("--profile", action="store_true", help="print a cProfile of the load")
    parser.add_argument("--asyncio", action="store_true", help="asyncio's loop, not uvloop")
    parser.add_argument("--pin", action="store_true", help="server on CPU 0, this process on 1")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        model_dir = make_model_dir(Path(tmp) / "tiny", max_position_embeddings=4096)
        with mocker_server(model_dir, args.speedup_ratio, "0" if args.pin else None) as url:
            if args.pin:
                os.sched_setaffinity(0, {1})
            factory = None if args.asyncio else loop_factory()
            for k in range(args.repeats):
                with asyncio.Runner(loop_factory=factory) as runner:
                    runner.run(measure(args, url, model_dir, seed=k))


if __name__ == "__main__":
    main()
