"""KV tiers in the mocker: multi-turn sessions whose prefixes add up to 4x the GPU KV cache,
TTFT with host / disk tiers against the GPU tier alone, and the hit rate per tier.

    python benchmarks/kv_offload.py [--sessions 16] [--prefix 4096] [--turns 4]

One mocker in-process, 8B-shaped KV (128 KiB per token, blocks of 64 tokens: 8 MiB), the
default (Dynamo's) timing model, `--gpu-blocks` 256 (16k tokens). S sessions of P-token
distinct prefixes, each a closed loop of T turns, at most C turns in flight at once: a turn appends 256 user
tokens to the conversation, asks for 32 tokens and appends them; S x P is 4x the GPU cache,
so a session's prefix has usually left the GPU by its next turn. Configurations:
gpu (no tiers), host (a host tier holding everything, 25 GB/s copy-back), host+disk (a
host tier of a quarter of the working set above a disk tier holding the rest, 3 GB/s).
TTFT is simulated time (wall time x the speedup ratio).
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
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from stator.engines.mocker import MockerConfig, create_engine
from stator.protocols import EngineRequest, SamplingOptions, StopConditions
from tests.model_factory import make_model_dir

KV_BYTES_PER_TOKEN = 131072  # Llama-3.1-8B in bf16: 32 layers x 2 x 8 heads x 128 x 2 bytes


async def run_config(model_dir: Path, args: argparse.Namespace, host: int, disk: int) -> dict:
    config = MockerConfig(
        num_gpu_blocks=args.gpu_blocks,
        block_size=args.block_size,
        speedup_ratio=args.speedup_ratio,
        kv_bytes_per_token=KV_BYTES_PER_TOKEN,
        host_cache_blocks=host,
        disk_cache_blocks=disk,
        max_model_len=65536,
    )
    engine = create_engine(config, str(model_dir), "tiny")
    await engine.start()
    rng = random.Random(0)
    later: list[float] = []
    first: list[float] = []
    prompt_tokens = cached_tokens = 0

    slots = asyncio.Semaphore(args.concurrency)

    async def session(i: int) -> None:
        conversation = [rng.randrange(10, 2000) for _ in range(args.prefix)]
        for turn in range(args.turns):
            async with slots:
                await one_turn(i, turn, conversation)

    async def one_turn(i: int, turn: int, conversation: list[int]) -> None:
        nonlocal prompt_tokens, cached_tokens
        conversation.extend(rng.randrange(10, 2000) for _ in range(256))
        req = EngineRequest(
            request_id=f"s{i}t{turn}",
            model="tiny",
            token_ids=list(conversation),
            sampling=SamplingOptions(seed=i * 100 + turn),
            stop=StopConditions(max_tokens=32, ignore_eos=True),
        )
        began = time.perf_counter()
        ttft = None
        async for out in engine.generate(req):
            if ttft is None:
                ttft = (time.perf_counter() - began) * args.speedup_ratio
                if turn:
                    prompt_tokens += len(req.token_ids)
                    cached_tokens += out.cached_tokens or 0
            conversation.extend(out.token_ids)
        assert ttft is not None
        (later if turn else first).append(ttft)

    began = time.perf_counter()
    await asyncio.gather(*(session(i) for i in range(args.sessions)))
    wall = time.perf_counter() - began
    metrics = engine.metrics()
    await engine.shutdown()
    bs = args.block_size
    host_hits = metrics.get("kv_host_hits", 0) * bs
    disk_hits = metrics.get("kv_disk_hits", 0) * bs
    return {
        "first_turn_ttft_p50_ms": statistics.median(first) * 1e3,
        "ttft_p50_ms": statistics.median(later) * 1e3,
        "ttft_p90_ms": statistics.quantiles(later, n=10)[-1] * 1e3,
        # Prompt tokens of turns 2.. found in each tier (tier hits count every turn; the
        # first turns' prompts are all new, so they add nothing).
        "hit_rate_gpu": (cached_tokens - host_hits - disk_hits) / prompt_tokens,
        "hit_rate_host": host_hits / prompt_tokens,
        "hit_rate_disk": disk_hits / prompt_tokens,
        "simulated_s": wall * args.speedup_ratio,
    }


async def main_async(args: argparse.Namespace) -> dict:
    model_dir = make_model_dir(Path(tempfile.mkdtemp(prefix="kv-offload-")) / "tiny",
                               max_position_embeddings=65536)  # fmt: skip
    working_set = args.sessions * (args.prefix + args.turns * 288) // args.block_size
    configs = {
        "gpu": (0, 0),
        "host": (working_set, 0),
        "host+disk": (working_set // 4, working_set),
    }
    out = {
        "working_set_blocks": working_set,
        "gpu_blocks": args.gpu_blocks,
        "working_set_vs_gpu": working_set / args.gpu_blocks,
    }
    for name, (host, disk) in configs.items():
        out[name] = await run_config(model_dir, args, host, disk)
    for name in ("host", "host+disk"):
        for q in ("p50", "p90"):
            out[f"{name}_ttft_{q}_ratio"] = out[name][f"ttft_{q}_ms"] / out["gpu"][f"ttft_{q}_ms"]
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sessions", type=int, default=16)
    parser.add_argument("--prefix", type=int, default=4096)
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--gpu-blocks", type=int, default=256)
    parser.add_argument("--block-size", type=int, default=64)
    parser.add_argument("--speedup-ratio", type=float, default=5.0)
    parser.add_argument("--concurrency", type=int, default=4, help="turns in flight at once")
    parser.add_argument("--json", default="")
    args = parser.parse_args()
    out = asyncio.run(main_async(args))
    text = json.dumps(out, indent=1)
    print(text)
    if args.json:
        Path(args.json).write_text(text)


if __name__ == "__main__":
    main()
