"""KV index throughput: block events applied per second, and lookups per second (with
p50/p99 latency) for a long prompt over a large fleet.

    python benchmarks/kv_index.py                      # 64 workers x 100k blocks, 4k-token prompts
    python benchmarks/kv_index.py --workers 8 --blocks-per-worker 10000   # quick

The fleet: every worker holds `--blocks-per-worker` blocks, half of them from a pool of
prefix chains shared across workers (system prompts), half its own; on top of that each
query prompt is cached on every worker to a random depth, so lookups walk deep and drop
workers one by one. Events carry `--blocks-per-event` blocks each (engines batch the
blocks of one scheduler step).
"""

from __future__ import annotations

import argparse
import gc
import random
import statistics
import time

import numpy as np

from stator.kv.hashing import block_hashes
from stator.protocols import BlockRemoved, BlockStored, KvEvent, KvEventBatch, decode, encode
from stator.router.kv_index import KvIndex
from stator.router.kv_sync import KvEventSync


def random_hashes(rng: np.random.Generator, n: int) -> list[int]:
    return rng.integers(1, 2**63, size=n, dtype=np.int64).tolist()


def build_events(args, rng: np.random.Generator, queries: list[list[int]]) -> list[list[KvEvent]]:
    """Per worker: its stored events, in order."""
    chain = args.chain_blocks
    pool = [random_hashes(rng, chain) for _ in range(args.shared_chains)]
    pyrng = random.Random(args.seed)
    per_worker = []
    for w in range(args.workers):
        blocks: list[int] = []
        for q in queries:
            if args.depths == "random":
                depth = pyrng.randint(0, len(q))
            else:
                depth = pyrng.choice([len(q) // 8, len(q) // 4, len(q) // 2, len(q)])
            blocks.extend(q[:depth])
        shared_budget = (args.blocks_per_worker - len(blocks)) // 2
        for c in pyrng.sample(pool, min(len(pool), shared_budget // chain)):
            blocks.extend(c)
        blocks.extend(random_hashes(rng, args.blocks_per_worker - len(blocks)))
        step = args.blocks_per_event
        events = [
            KvEvent(
                worker_id=w + 1, event_id=i + 1, data=BlockStored(block_hashes=blocks[s : s + step])
            )
            for i, s in enumerate(range(0, len(blocks), step))
        ]
        per_worker.append(events)
    return per_worker


def interleave(per_worker: list[list[KvEvent]]) -> list[KvEvent]:
    out = []
    for i in range(max(len(e) for e in per_worker)):
        out.extend(events[i] for events in per_worker if i < len(events))
    return out


class Timer:
    """Wall time and this process's CPU time: on a shared machine the CPU time says what
    one core does when the process has it to itself."""

    def __enter__(self) -> Timer:
        self.wall0, self.cpu0 = time.perf_counter(), time.process_time()
        return self

    def __exit__(self, *exc) -> None:
        self.wall = time.perf_counter() - self.wall0
        self.cpu = time.process_time() - self.cpu0

    def rate(self, count: float, unit: float = 1e6) -> str:
        return f"{count / self.wall / unit:.2f} wall, {count / self.cpu / unit:.2f} cpu"


def percentile(values: list[float], p: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(p / 100 * len(values)))]


def calibration() -> float:
    """CPU microseconds for 256 `dict.get`s on a small dict: the floor of any walk over a
    4k-token prompt, to read the numbers below against the machine's speed."""
    d = {i * 7919: i for i in range(1000)}
    keys = list(d)[:256]
    get = d.get
    best = float("inf")
    for _ in range(5):
        t = time.process_time()
        for _ in range(1000):
            for k in keys:
                get(k, 0)
        best = min(best, (time.process_time() - t) / 1000)
    return best * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--workers", type=int, default=64)
    parser.add_argument("--blocks-per-worker", type=int, default=100_000)
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--prompt-tokens", type=int, default=4096)
    parser.add_argument("--queries", type=int, default=50)
    parser.add_argument("--lookups", type=int, default=20_000)
    parser.add_argument("--blocks-per-event", type=int, default=16)
    parser.add_argument("--shared-chains", type=int, default=2000)
    parser.add_argument("--chain-blocks", type=int, default=128)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--jump",
        type=int,
        default=8,
        help="KvIndex jump stride (the router's default; 1: exact walk)",
    )
    parser.add_argument(
        "--depths",
        choices=["random", "few"],
        default="random",
        help="how deep workers hold each query: a random depth per worker (worst case: the "
        "walk loses workers one by one), or one of 4 depths (fleets with shared prefixes)",
    )
    args = parser.parse_args()

    print(f"calibration: 256 dict.get on a small dict: {calibration():.1f} us cpu")
    rng = np.random.default_rng(args.seed)
    bs = args.block_size
    prompts = [
        rng.integers(0, 50_000, size=args.prompt_tokens).tolist() for _ in range(args.queries)
    ]
    queries = [block_hashes(p, bs) for p in prompts]
    t = time.perf_counter()
    per_worker = build_events(args, rng, queries)
    events = interleave(per_worker)
    n_blocks = sum(len(e.data.block_hashes) for e in events)
    print(
        f"fleet: {args.workers} workers x {args.blocks_per_worker} blocks "
        f"({n_blocks} block stores in {len(events)} events of <= {args.blocks_per_event}), "
        f"built in {time.perf_counter() - t:.1f}s"
    )

    # -- events ---------------------------------------------------------------------
    index = KvIndex(bs, jump=args.jump)
    sync = KvEventSync(index)
    gc.disable()
    with Timer() as timer:
        for event in events:
            sync.apply(event)
    gc.enable()
    print(f"store:  M blocks/s: {timer.rate(n_blocks)}; {index.num_blocks()} distinct blocks")

    # Removing and re-storing 10% of every worker's blocks (eviction churn).
    churn = []
    for w, worker_events in enumerate(per_worker):
        next_id = len(worker_events) + 1
        for e in worker_events[::10]:
            churn.append(
                KvEvent(
                    worker_id=w + 1,
                    event_id=next_id,
                    data=BlockRemoved(block_hashes=e.data.block_hashes),
                )
            )
            churn.append(KvEvent(worker_id=w + 1, event_id=next_id + 1, data=e.data))
            next_id += 2
    churn_blocks = sum(len(e.data.block_hashes) for e in churn)
    gc.disable()
    with Timer() as timer:
        for event in churn:
            sync.apply(event)
    gc.enable()
    assert sync.gaps == 0
    print(
        f"churn:  M blocks/s: {timer.rate(churn_blocks)} (remove + re-store, {churn_blocks} blocks)"
    )

    # Decoding from the wire too: batches of 32 events as msgpack.
    fresh = KvEventSync(KvIndex(bs))
    sample = events[: min(len(events), 100_000)]
    payloads = [encode(KvEventBatch(events=sample[i : i + 32])) for i in range(0, len(sample), 32)]
    sample_blocks = sum(len(e.data.block_hashes) for e in sample)
    with Timer() as timer:
        for payload in payloads:
            for event in decode(payload, KvEventBatch).events:
                fresh.apply(event)
    print(f"wire:   M blocks/s: {timer.rate(sample_blocks)} (msgpack decode + apply)")

    # -- lookups --------------------------------------------------------------------
    lat, cpu_lat = [], []
    matched = 0
    find = index.find_matches
    wall, cpu = time.perf_counter, time.process_time
    with Timer() as timer:
        for i in range(args.lookups):
            q = queries[i % len(queries)]
            w0, c0 = wall(), cpu()
            matched += len(find(q))
            c1, w1 = cpu(), wall()
            lat.append(w1 - w0)
            cpu_lat.append(c1 - c0)
    print(
        f"lookup: k lookups/s of {len(queries[0])} blocks: {timer.rate(args.lookups, 1e3)}; "
        f"latency us wall p50 {statistics.median(lat) * 1e6:.0f} p99 {percentile(lat, 99) * 1e6:.0f}, "
        f"cpu p50 {statistics.median(cpu_lat) * 1e6:.0f} p99 {percentile(cpu_lat, 99) * 1e6:.0f}; "
        f"{matched / args.lookups:.0f} workers matched per lookup"
    )
    n = min(args.lookups, 2000)
    with Timer() as timer:
        for i in range(n):
            find(block_hashes(prompts[i % len(prompts)], bs))
    print(f"hash+lookup: k/s: {timer.rate(n, 1e3)} ({args.prompt_tokens} tokens hashed per lookup)")


if __name__ == "__main__":
    main()
