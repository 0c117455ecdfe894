"""Routing policies compared on a simulated fleet: mocker workers behind the `Router`, all
in one process (mem discovery, in-process request and event planes; no HTTP), so the
numbers are the router's and the simulated engines', not the frontend's.

    PYTHONPATH=. python benchmarks/routing.py                    # every workload, every policy
    PYTHONPATH=. python benchmarks/routing.py --workload shared-prefix --policies kv,round-robin

Workloads:
- `shared-prefix`: many tenants, each with a long system prompt, short unique questions,
  Poisson arrivals. The fleet's KV cache holds every tenant's prompt only if each tenant
  sticks to a few workers.
- `mooncake`: the Mooncake conversation trace (`--trace`), replayed at its timestamps
  (divided by `--time-scale`); each 512-token hash id becomes 512 fixed tokens, so
  requests that share hash ids share prefixes. `--trace-start S --warmup W` measures a
  window from trace second S, after replaying W trace seconds before it unmeasured (the
  first minutes of the trace reuse less than later ones, whose conversations started
  earlier: at most 29% of the first 600 s's prompt blocks can come from a cache, ~38%
  of a later 600 s after a 300 s warm-up).
- `no-reuse`: unique random prompts, Poisson arrivals: nothing to gain from the cache.

Each (workload, policy) run starts a fresh fleet. Reported per run: TTFT p50/p90/p99,
mean inter-token latency, output tokens/s, rejections, the prefix hit rate (prompt
tokens the engines served from their cache / all prompt tokens), and the process's CPU
time over wall time (fleet and router share one core: near 100% the numbers measure
Python, not the routing), and the router's mean decision time (its
`stator_router_routing_seconds`: hashing the prompt, the index lookup, the cost).
After the table: each workload's perfect-cache bound (the hit rate of one infinite cache
every request reaches) and, with `--explain`, how often kv passed over the worker with
the longest cached prefix and which cost term made another worker cheaper.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import random
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path

from prometheus_client import CollectorRegistry

# run as a script: its folder is on sys.path
from routing_workloads import WORKLOADS, Arrival, perfect_cache_hit

import stator.router.router as router_module
from stator.engines.mocker.config import MockerConfig
from stator.engines.mocker.engine import MockerEngine
from stator.protocols import (
    AdminRequest,
    AdminResponse,
    EngineOutput,
    EngineRequest,
    KvEventBatch,
    ModelCard,
    StopConditions,
)
from stator.router import Overloaded, Router, RouterConfig
from stator.runtime import Runtime, RuntimeConfig
from stator.runtime.discovery import mem as mem_discovery
from stator.runtime.event_plane import inproc as inproc_events

GENERATE = "bench.backend.generate"
ADMIN = "bench.backend.admin"
POLICIES = ["round-robin", "random", "power-of-two", "least-loaded", "kv"]
REPO = Path(__file__).resolve().parents[1]
# The shared data folder sits beside the main checkout (../shared) and two levels above a
# helper's worktree (../../shared).
TRACE = (
    next(
        (p for p in (REPO.parent / "shared", REPO.parent.parent / "shared") if p.is_dir()),
        REPO.parent / "shared",
    )
    / "data"
    / "mooncake"
    / "conversation_trace.jsonl"
)


# -- the fleet ---------------------------------------------------------------------------


class Host:
    """A minimal in-process worker host around one mocker engine: serves generate and
    the admin `kv_state` op, forwards KV events, publishes load reports."""

    def __init__(self, runtime: Runtime, engine: MockerEngine) -> None:
        self.runtime = runtime
        self.engine = engine
        self.tasks: list[asyncio.Task] = []

    @classmethod
    async def start(cls, namespace: str, config: MockerConfig, card: ModelCard) -> Host:
        runtime = await Runtime.create(RuntimeConfig(namespace=namespace, discovery="mem"))
        engine = MockerEngine(config, card, vocab_size=32000, kv_bytes_per_token=0)
        engine.worker_id = runtime.instance_id
        await engine.start()
        host = cls(runtime, engine)
        await runtime.serve(GENERATE, engine.generate, EngineRequest)
        await runtime.serve(ADMIN, host.admin, AdminRequest)
        host.tasks.append(asyncio.create_task(host.forward_events()))
        host.tasks.append(asyncio.create_task(host.report_load()))
        return host

    async def admin(self, request: AdminRequest):
        yield AdminResponse(result=self.engine.kv_state())

    async def forward_events(self) -> None:
        async for batch in self.engine.kv_events():
            await self.runtime.publish("kv_events", KvEventBatch(events=list(batch)))

    async def report_load(self) -> None:
        while True:
            for report in self.engine.load():
                await self.runtime.publish("load", report)
            await asyncio.sleep(0.1)

    async def stop(self) -> None:
        for task in self.tasks:
            task.cancel()
        for task in self.tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await self.engine.shutdown()
        await self.runtime.shutdown()


# -- why kv routes where it does (--explain) -----------------------------------------


@dataclass
class Explain:
    """Counts over the kv router's decisions: how often the worker with the longest
    cached prefix was passed over, how many blocks that cost, and which cost term made
    another worker cheaper. `queue`: its queued-prefill term alone outweighed its prefix
    advantage; `active`: its active-blocks term alone did; `both`: only together."""

    decisions: int = 0
    best_blocks: int = 0  # sum over decisions of the longest cached prefix anywhere
    chosen_blocks: int = 0  # ... and of the prefix cached on the chosen worker
    lost: int = 0
    lost_blocks: int = 0
    by_term: dict[str, int] = field(default_factory=lambda: {"queue": 0, "active": 0, "both": 0})

    def observe(self, candidates, choice, prompt_tokens: int, block_size: int, weight: float):
        self.decisions += 1
        best = max(candidates, key=lambda c: (c.overlap_blocks, -choice.costs[c.key]))
        chosen = next(c for c in candidates if c.key == choice.key)
        self.best_blocks += best.overlap_blocks
        self.chosen_blocks += chosen.overlap_blocks
        if chosen.overlap_blocks >= best.overlap_blocks:
            return
        self.lost += 1
        self.lost_blocks += best.overlap_blocks - chosen.overlap_blocks
        advantage = weight * (best.overlap_blocks - chosen.overlap_blocks)
        queue = (
            weight * (best.inflight_prefill_tokens - chosen.inflight_prefill_tokens) / block_size
        )
        prompt_blocks = -(-prompt_tokens // block_size)

        def decode(c) -> int:
            return c.active_blocks + max(0, prompt_blocks - c.active_overlap)

        active = decode(best) - decode(chosen)
        term = "queue" if queue >= advantage else "active" if active >= advantage else "both"
        self.by_term[term] += 1

    def summary(self) -> str:
        d = max(self.decisions, 1)
        return (
            f"kv decisions {self.decisions}: longest cached prefix {self.best_blocks} blocks, "
            f"routed to {self.chosen_blocks} ({self.chosen_blocks / max(self.best_blocks, 1):.0%}); "
            f"passed over the longest prefix {self.lost} times ({self.lost / d:.0%}, "
            f"{self.lost_blocks} blocks), because of: {self.by_term}"
        )


CHOOSE = router_module.choose


def explaining(explain: Explain, block_size: int):
    """The router's `choose`, recording each decision in `explain`. A benchmark-only
    wrapper, put in place of the router module's `choose` for one run."""

    def wrapped(candidates, prompt_tokens, size, weight, temperature, rng):
        choice = CHOOSE(candidates, prompt_tokens, size, weight, temperature, rng)
        explain.observe(candidates, choice, prompt_tokens, block_size, weight)
        return choice

    return wrapped


# -- the run -----------------------------------------------------------------------------


@dataclass
class Result:
    ttft: list[float] = field(default_factory=list)
    itl: list[float] = field(default_factory=list)
    output_tokens: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    rejected: int = 0
    failed: int = 0
    seconds: float = 0.0
    cpu_seconds: float = 0.0  # this process's CPU time over the run (fleet + router)
    routing_ms: float = 0.0  # mean time the router took to choose (its routing_seconds)
    explain: Explain = field(default_factory=Explain)


async def one_request(router: Router, rid: str, arrival: Arrival, result: Result) -> None:
    if not arrival.measured:
        result = Result()  # warm-up: sent and served, counted nowhere
    request = EngineRequest(
        request_id=rid,
        model="bench",
        token_ids=arrival.tokens,
        stop=StopConditions(max_tokens=arrival.max_tokens, ignore_eos=True),
    )
    started = time.perf_counter()
    first = last = None
    count = 0
    try:
        async for out in router.generate(request):
            now = time.perf_counter()
            if out.cached_tokens is not None:
                result.cached_tokens += out.cached_tokens
            if out.token_ids:
                if first is None:
                    first = now
                last = now
                count += len(out.token_ids)
    except Overloaded:
        result.rejected += 1
        return
    except Exception:
        result.failed += 1
        return
    result.prompt_tokens += len(arrival.tokens)
    result.output_tokens += count
    if first is not None:
        result.ttft.append(first - started)
        if count > 1:
            result.itl.append((last - first) / (count - 1))


async def run(policy: str, arrivals: list[Arrival], args) -> Result:
    namespace = f"bench{random.getrandbits(32)}"
    mocker = MockerConfig(
        num_gpu_blocks=args.kv_blocks,
        block_size=args.block_size,
        speedup_ratio=args.speedup,
        max_num_batched_tokens=args.max_batched_tokens,
    )
    card = ModelCard(
        name="bench",
        source_path="",
        context_length=args.context_length,
        kv_block_size=args.block_size,
        total_kv_blocks=args.kv_blocks,
        max_num_batched_tokens=args.max_batched_tokens,
    )
    hosts = [await Host.start(namespace, mocker, card) for _ in range(args.workers)]
    frontend = await Runtime.create(RuntimeConfig(namespace=namespace, discovery="mem"))
    client = await frontend.client(GENERATE, EngineOutput)
    await client.wait_for_instances(args.workers, timeout=10)
    config = RouterConfig(
        router_mode=policy, router_seed=0, kv_overlap_score_weight=args.kv_overlap_score_weight
    )
    router = Router(frontend, client, card, config, registry=CollectorRegistry())
    await router.start()
    result = Result()
    if args.explain:
        router_module.choose = explaining(result.explain, args.block_size)
    tasks = []
    t0 = time.perf_counter()
    cpu0 = time.process_time()
    for i, arrival in enumerate(arrivals):
        delay = t0 + arrival.at - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(one_request(router, f"r{i}", arrival, result)))
    await asyncio.gather(*tasks)
    # Throughput over the measured part: from its first arrival to the end.
    result.seconds = time.perf_counter() - t0 - min(a.at for a in arrivals if a.measured)
    result.cpu_seconds = time.process_time() - cpu0
    for metric in router.metrics.routing_seconds.collect():
        values = {s.name: s.value for s in metric.samples}
        count = values.get("stator_router_routing_seconds_count", 0)
        if count:
            result.routing_ms = values["stator_router_routing_seconds_sum"] / count * 1000
    router_module.choose = CHOOSE
    await router.close()
    await client.close()
    for host in hosts:
        await host.stop()
    await frontend.shutdown()
    return result


def pct(values: list[float], p: float) -> float:
    if not values:
        return float("nan")
    values = sorted(values)
    return values[min(len(values) - 1, int(p / 100 * len(values)))]


def report(workload: str, policy: str, r: Result) -> str:
    ms = 1000
    hit = r.cached_tokens / r.prompt_tokens if r.prompt_tokens else 0.0
    itl = statistics.mean(r.itl) * ms if r.itl else float("nan")
    return (
        f"| {workload} | {policy} | {pct(r.ttft, 50) * ms:.0f} | {pct(r.ttft, 90) * ms:.0f} | "
        f"{pct(r.ttft, 99) * ms:.0f} | {itl:.1f} | {r.output_tokens / r.seconds:.0f} | "
        f"{r.rejected} | {r.failed} | {hit:.1%} | {r.cpu_seconds / r.seconds:.0%} | {r.routing_ms:.3f} |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--workload", choices=[*WORKLOADS, "all"], default="all")
    parser.add_argument("--policies", default=",".join(POLICIES))
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--kv-overlap-score-weight",
        type=float,
        default=RouterConfig().kv_overlap_score_weight,
        help="the router's weight of prefill against decode blocks (kv and the load-aware "
        "policies)",
    )
    fleet = parser.add_argument_group("fleet (mocker)")
    fleet.add_argument("--speedup", type=float, default=1.0)
    fleet.add_argument("--kv-blocks", type=int, default=1024)
    fleet.add_argument("--block-size", type=int, default=64)
    fleet.add_argument("--max-batched-tokens", type=int, default=8192)
    fleet.add_argument("--context-length", type=int, default=32768)
    load = parser.add_argument_group("poisson workloads")
    load.add_argument("--rate", type=float, default=20.0, help="requests per second")
    load.add_argument("--requests", type=int, default=600)
    load.add_argument("--output-tokens", type=int, default=16)
    load.add_argument("--tenants", type=int, default=32)
    load.add_argument("--system-tokens", type=int, default=4096)
    load.add_argument("--question-tokens", type=int, default=64)
    load.add_argument("--unique-tokens", type=int, default=1024)
    trace = parser.add_argument_group("mooncake")
    trace.add_argument("--trace", default=str(TRACE))
    trace.add_argument("--time-scale", type=float, default=4.0, help="replay this much faster")
    trace.add_argument(
        "--duration", type=float, default=60.0, help="seconds of measured replay (wall)"
    )
    trace.add_argument(
        "--trace-start", type=float, default=0.0, help="trace second where measuring starts"
    )
    trace.add_argument(
        "--warmup",
        type=float,
        default=0.0,
        help="trace seconds before --trace-start replayed (same time scale) to warm the "
        "caches, not measured",
    )
    trace.add_argument("--max-input-tokens", type=int, default=16384)
    trace.add_argument("--max-output", type=int, default=32)
    parser.add_argument(
        "--explain",
        action="store_true",
        help="kv: count how often the worker with the longest cached prefix was passed "
        "over, and which cost term made another worker cheaper",
    )
    args = parser.parse_args()

    workloads = list(WORKLOADS) if args.workload == "all" else [args.workload]
    policies = args.policies.split(",")
    print(
        "| workload | policy | TTFT p50 ms | TTFT p90 ms | TTFT p99 ms | ITL ms | "
        "out tok/s | rejected | failed | prefix hit | CPU | routing ms |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    notes = []
    for workload in workloads:
        arrivals = WORKLOADS[workload](args, random.Random(args.seed))
        notes.append(
            f"{workload}: {sum(a.measured for a in arrivals)} measured requests; a perfect "
            f"infinite cache would hit {perfect_cache_hit(arrivals, args.block_size):.1%} "
            "of their prompt tokens"
        )
        for policy in policies:
            # Each run gets a fresh event loop, so fresh in-process buses too.
            mem_discovery._stores.clear()
            inproc_events._buses.clear()
            result = asyncio.run(run(policy, arrivals, args))
            print(report(workload, policy, result), flush=True)
            if args.explain and result.explain.decisions:
                notes.append(f"{workload} {policy}: {result.explain.summary()}")
    print()
    for note in notes:
        print(note)


if __name__ == "__main__":
    main()
