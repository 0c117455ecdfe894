"""CPU cost of one mocker per request: how many mockers fit on a core for routing tests.

Runs closed-loop requests in-process against one mocker and divides the process's CPU time
(user + system) by the number of requests. The consumer is the cheapest possible (iterate
the stream, keep nothing), as in a worker host, so the figure is the engine's own cost:
scheduling, block manager, hashing, KV events, token sampling and stream wake-ups.

    python benchmarks/mocker_cpu.py --speedup-ratio 100 --requests 2000 --concurrency 32
"""

from __future__ import annotations

import argparse
import asyncio
import random
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from stator.engines.mocker import MockerConfig, create_engine
from stator.protocols import EngineRequest, StopConditions
from tests.model_factory import make_model_dir


async def run(args: argparse.Namespace) -> None:
    model_dir = make_model_dir(Path(tempfile.mkdtemp(prefix="mocker-cpu-")) / "tiny",
                               max_position_embeddings=32768)  # fmt: skip
    config = MockerConfig(speedup_ratio=args.speedup_ratio, block_size=args.block_size)
    engine = create_engine(config, str(model_dir), "tiny")
    await engine.start()
    rng = random.Random(0)
    prompts = [[rng.randrange(10, 2000) for _ in range(args.isl)] for _ in range(args.requests)]
    events = 0

    async def drain_events() -> None:
        nonlocal events
        async for batch in engine.kv_events():
            events += len(batch)

    drainer = asyncio.create_task(drain_events())
    queue = list(enumerate(prompts))

    async def client() -> None:
        while queue:
            i, prompt = queue.pop()
            req = EngineRequest(
                request_id=f"r{i}",
                model="tiny",
                token_ids=prompt,
                stop=StopConditions(max_tokens=args.osl, min_tokens=args.osl, ignore_eos=True),
            )
            async for _ in engine.generate(req):
                pass

    wall, cpu = time.perf_counter(), time.process_time()
    await asyncio.gather(*[client() for _ in range(args.concurrency)])
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    drainer.cancel()
    await engine.shutdown()
    print(
        f"{args.requests} requests {args.isl}-in/{args.osl}-out, concurrency {args.concurrency}, "
        f"speedup {args.speedup_ratio}, block size {args.block_size}, loop {args.loop}: "
        f"wall {wall:.2f} s, CPU {cpu:.2f} s, CPU per request {1000 * cpu / args.requests:.3f} ms, "
        f"{args.requests / wall:.0f} req/s, {events} KV events"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--isl", type=int, default=512)
    parser.add_argument("--osl", type=int, default=64)
    parser.add_argument("--speedup-ratio", type=float, default=100.0)
    parser.add_argument("--block-size", type=int, default=64)
    parser.add_argument("--loop", choices=["asyncio", "uvloop"], default="asyncio")
    args = parser.parse_args()
    if args.loop == "uvloop":
        import uvloop

        uvloop.install()
    asyncio.run(run(args))


if __name__ == "__main__":
    main()
