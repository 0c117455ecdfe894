"""Disaggregated vs aggregated serving on mocker workers (simulated time): long prompts
mixed into ongoing decodes.

Every configuration gets the same workload and the same number of workers: aggregated N
vs N/2 prefill + N/2 decode. Requests arrive as a Poisson process; most have short
prompts (they prefill on the decode worker under `--disagg-min-prefill-tokens`), a
fraction have 8k-token prompts (they go to a prefill worker). In an aggregated worker an
8k prefill shares its step with every decoding stream, so those streams see one slow
token; disaggregated, decode workers only ever run a one-token prefill.

The fleet runs in this process (mem discovery, in-process request plane) and the client
calls the `DisaggRouter` directly, so no HTTP or tokenizer cost blurs the timings. Times are
simulated: with `--speedup-ratio S` the mocker runs S times faster than the model it
imitates and every measured interval is multiplied by S.

    python benchmarks/disagg.py                       # the recorded table
    python benchmarks/disagg.py --workers 2 --duration 30 --json out.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from prometheus_client import CollectorRegistry

from stator.engines.mocker import MockerConfig, create_engine
from stator.protocols import AdminResponse, EngineOutput, EngineRequest, StopConditions
from stator.router import Router, RouterConfig
from stator.router.disagg import DisaggRouter
from stator.runtime import Runtime, RuntimeConfig
from stator.worker.config import WorkerConfig
from stator.worker.host import WorkerHost
from tests.model_factory import make_model_dir

TTFT_SLO = 2.0
ITL_SLO = 0.050
LLAMA_8B_KV_BYTES_PER_TOKEN = 2 * 32 * 8 * 128 * 2  # 128 KiB


@dataclass
class Record:
    start: float
    long: bool
    times: list[float] = field(default_factory=list)

    @property
    def ttft(self) -> float:
        return self.times[0] - self.start

    @property
    def itls(self) -> list[float]:
        return [b - a for a, b in zip(self.times, self.times[1:], strict=False)]


async def start_fleet(args, model_dir: Path, roles: list[str], store: str):
    hosts = []
    for role in roles:
        config = MockerConfig(
            speedup_ratio=args.speedup_ratio,
            block_size=args.block_size,
            num_gpu_blocks=args.num_gpu_blocks,
            kv_bytes_per_token=LLAMA_8B_KV_BYTES_PER_TOKEN,
            kv_transfer_bandwidth=args.kv_bandwidth,
            role=role,
        )
        engine = create_engine(config, str(model_dir), "m")
        runtime = await Runtime.create(RuntimeConfig(discovery=f"mem:{store}"))
        host = WorkerHost(
            runtime,
            engine,
            WorkerConfig(role=role, health_check_interval=0, load_report_interval=0.25),
            model_dir=model_dir,
        )
        await host.start()
        hosts.append(host)
    frontend = await Runtime.create(RuntimeConfig(discovery=f"mem:{store}"))
    card = next(h.card for h in hosts if h.card.role != "prefill")
    config = RouterConfig(
        router_mode="kv", router_seed=0, disagg_min_prefill_tokens=args.min_prefill_tokens
    )
    registry = CollectorRegistry()
    decode_client = await frontend.client("stator.backend.generate", EngineOutput)
    prefill_client = await frontend.client("stator.prefill.generate", EngineOutput)
    admin = await frontend.client("stator.prefill.admin", AdminResponse)
    decode = Router(frontend, decode_client, card, config, registry=registry)
    prefill = Router(frontend, prefill_client, card, config, registry=registry)
    router = DisaggRouter(decode, prefill, config, prefill_admin=admin)
    await router.start()
    n_decode = sum(r != "prefill" for r in roles)
    await decode_client.wait_for_instances(n_decode)
    if len(roles) > n_decode:
        await prefill_client.wait_for_instances(len(roles) - n_decode)
    return router, hosts, [frontend] + [h.runtime for h in hosts]


def workload(args) -> list[tuple[float, list[int], int, bool]]:
    """(arrival time in simulated seconds, prompt, output length, is long)."""
    rng = random.Random(args.seed)
    out, t = [], 0.0
    while t < args.duration:
        t += rng.expovariate(args.rate)
        long = rng.random() < args.long_fraction
        n = args.long_isl if long else rng.randint(args.short_isl // 2, args.short_isl)
        prompt = [rng.randrange(10, 4000) for _ in range(n)]
        out.append((t, prompt, args.osl, long))
    return out


async def run_config(args, model_dir: Path, roles: list[str], name: str) -> dict:
    router, hosts, runtimes = await start_fleet(args, model_dir, roles, f"bench-{name}")
    s = args.speedup_ratio
    records: list[Record] = []
    loop = asyncio.get_running_loop()
    began = loop.time()

    async def one(i: int, at: float, prompt: list[int], osl: int, long: bool) -> None:
        await asyncio.sleep(max(0.0, began + at / s - loop.time()))
        rec = Record(loop.time(), long)
        records.append(rec)
        req = EngineRequest(
            request_id=f"{name}-{i}",
            model="m",
            token_ids=prompt,
            stop=StopConditions(max_tokens=osl, min_tokens=osl, ignore_eos=True),
        )
        async for out in router.generate(req):
            now = loop.time()
            rec.times.extend([now] * len(out.token_ids))

    wall = time.perf_counter()
    await asyncio.gather(*(one(i, *w) for i, w in enumerate(workload(args))))
    wall = time.perf_counter() - wall
    paths = {}
    for metric in router.metrics.disagg_requests.collect():
        for sample in metric.samples:
            if sample.name.endswith("_total") and sample.value:
                paths[f"{sample.labels['path']}/{sample.labels['reason']}"] = sample.value
    await router.close()
    for host in hosts:
        await host.stop(grace=0)
    for runtime in runtimes:
        await runtime.shutdown(grace=0)
    return summarize(name, records, s, wall, paths, args.duration)


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    values = sorted(values)
    return values[min(len(values) - 1, int(q / 100 * len(values)))]


def summarize(
    name: str, records: list[Record], s: float, wall: float, paths: dict, window: float
) -> dict:
    ttfts = [r.ttft * s for r in records]
    itls = [x * s for r in records for x in r.itls]

    def meets(r: Record, stat) -> bool:
        return r.ttft * s <= TTFT_SLO and (not r.itls or stat([x * s for x in r.itls]) <= ITL_SLO)

    # A request meets the SLO when its TTFT is within 2 s and 99% of its inter-token gaps
    # within 50 ms (a stream that stalls is late however fast its average); the looser
    # DistServe form (mean gap, i.e. TPOT) is reported beside it.
    smooth = sum(meets(r, lambda xs: pct(xs, 99)) for r in records)
    mean = sum(meets(r, statistics.mean) for r in records)
    return {
        "config": name,
        "requests": len(records),
        "ttft_p50_ms": pct(ttfts, 50) * 1e3,
        "ttft_p99_ms": pct(ttfts, 99) * 1e3,
        "itl_p50_ms": pct(itls, 50) * 1e3,
        "itl_p99_ms": pct(itls, 99) * 1e3,
        "goodput_rps": smooth / window,
        "slo_attained": smooth / len(records),
        "goodput_tpot_rps": mean / window,
        "slo_tpot_attained": mean / len(records),
        "wall_s": wall,
        "paths": paths,
    }


async def main_async(args) -> list[dict]:
    model_dir = make_model_dir(
        Path(tempfile.mkdtemp(prefix="disagg-bench-")) / "m", max_position_embeddings=32768
    )
    results = []
    for n in args.workers:
        half = n // 2
        configs = [
            (f"aggregated x{n}", ["aggregated"] * n),
            (f"{half}P+{n - half}D", ["decode"] * (n - half) + ["prefill"] * half),
        ]
        for name, roles in configs:
            result = await run_config(args, model_dir, roles, name.replace(" ", ""))
            result["config"] = name
            print(json.dumps(result), flush=True)
            results.append(result)
    return results


def print_table(results: list[dict]) -> None:
    print(
        "| config | requests | TTFT p50 / p99 (ms) | ITL p50 / p99 (ms) | goodput (req/s, "
        "SLO attained) | goodput, TPOT form |"
    )
    print("|---|---|---|---|---|---|")
    for r in results:
        print(
            f"| {r['config']} | {r['requests']} | {r['ttft_p50_ms']:.0f} / {r['ttft_p99_ms']:.0f} "
            f"| {r['itl_p50_ms']:.1f} / {r['itl_p99_ms']:.1f} "
            f"| {r['goodput_rps']:.2f} ({r['slo_attained']:.0%}) "
            f"| {r['goodput_tpot_rps']:.2f} ({r['slo_tpot_attained']:.0%}) |"
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workers", type=int, nargs="+", default=[2, 4], help="fleet sizes")
    ap.add_argument("--duration", type=float, default=30.0, help="simulated seconds of arrivals")
    ap.add_argument(
        "--rate", type=float, default=8.0, help="requests per simulated second per 2 workers"
    )
    ap.add_argument("--long-fraction", type=float, default=0.4)
    ap.add_argument("--long-isl", type=int, default=8192)
    ap.add_argument("--short-isl", type=int, default=400)
    ap.add_argument("--osl", type=int, default=512)
    ap.add_argument("--block-size", type=int, default=64)
    ap.add_argument("--num-gpu-blocks", type=int, default=16384)
    ap.add_argument("--kv-bandwidth", type=float, default=64.0, help="GB/s of the simulated link")
    ap.add_argument("--speedup-ratio", type=float, default=4.0)
    ap.add_argument(
        "--min-prefill-tokens",
        type=int,
        default=512,
        help="--disagg-min-prefill-tokens: shorter prompts prefill on the decode worker",
    )
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    results = []
    for n in args.workers:
        sized = argparse.Namespace(**vars(args))
        sized.workers = [n]
        sized.rate = args.rate * n / 2
        results += asyncio.run(main_async(sized))
    print_table(results)
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
