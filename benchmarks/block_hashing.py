"""Block hashing benchmark: chained xxh3-64 hashes of 16-token blocks per second, through
`stator.kv.hashing.block_hashes`, over long sequences (as the router hashes prompts).

    python benchmarks/block_hashing.py [--tokens 131072] [--repeat 20]
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from stator.kv.hashing import block_hashes

BLOCK = 16


def measure(tokens: list[int], repeat: int, **kw) -> float:
    """Best-of-`repeat` blocks hashed per second."""
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        block_hashes(tokens, BLOCK, **kw)
        best = min(best, time.perf_counter() - start)
    return (len(tokens) // BLOCK) / best


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=131_072)
    parser.add_argument("--repeat", type=int, default=20)
    args = parser.parse_args()
    rng = random.Random(0)
    rows = []
    for length in (1024, 8192, args.tokens):
        tokens = [rng.randrange(150_000) for _ in range(length)]
        rate = measure(tokens, args.repeat)
        rows.append((f"{length:,} tokens ({length // BLOCK:,} blocks)", rate))
    tokens = [rng.randrange(150_000) for _ in range(8192)]
    rows.append(("8,192 tokens, LoRA seed", measure(tokens, args.repeat, lora_name="adapter")))
    width = max(len(name) for name, _ in rows)
    print(f"{'block_hashes, block size 16':<{width}}  hashes/s")
    for name, rate in rows:
        print(f"{name:<{width}}  {rate:,.0f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
