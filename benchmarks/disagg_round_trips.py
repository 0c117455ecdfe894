"""Host time of the round trips a burst of IPC pulls makes to one prefill server (issue
15): N pin checks, then N releases, all pending at once, with the decode agent's
coalescing on (`--kv-transfer-coalesce`: the first alone, the rest in one round trip each)
and off (one round trip each, one at a time on the shared connection). Both agents live in
this process on CPU pools, talking over a real TCP socket; no GPU and no copy: what this
measures is the per-pull host work that coalescing removes beside the copies.

    python benchmarks/disagg_round_trips.py --pulls 8 --reps 200
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from stator.kv.block_copy import pool_shape
from stator.kv.transfer.agent import KvTransferAgent
from stator.kv.transfer.config import TransferConfig


async def burst_ms(pulls: int, reps: int, coalesce: bool) -> dict:
    pins: dict[str, list[int]] = {}

    async def release(pin: str) -> bool:
        return pins.pop(pin, None) is not None

    pool = torch.zeros(pool_shape(2, 64, 4, 2, 8))
    prefill = KvTransferAgent(TransferConfig(kind="tcp"), pool, pins=pins.get, release=release)
    await prefill.serve()
    config = TransferConfig(kind="tcp", coalesce=coalesce)
    decode = KvTransferAgent(config, torch.zeros_like(pool))
    # Another process's agent id: releases go over the socket, as between two workers.
    transfer = {**prefill.describe(), "agent": "elsewhere"}
    times = []
    try:
        for rep in range(reps + 10):
            names = [f"{rep}-{i}" for i in range(pulls)]
            pins.update({name: [i] for i, name in enumerate(names)})
            started = time.perf_counter()
            await asyncio.gather(*(decode._checked(transfer, n, pins[n]) for n in names))
            await asyncio.gather(*(decode.release(transfer, n) for n in names))
            if rep >= 10:  # after a warm-up
                times.append(time.perf_counter() - started)
            assert not pins
    finally:
        await decode.close()
        await prefill.close()
    return {
        "median_ms": statistics.median(times) * 1e3,
        "p90_ms": sorted(times)[int(0.9 * len(times))] * 1e3,
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--pulls", type=int, default=8)
    ap.add_argument("--reps", type=int, default=200)
    args = ap.parse_args()
    out = {}
    for _ in range(3):  # interleaved rounds
        for name, on in (("serial", False), ("coalesced", True)):
            out.setdefault(name, []).append(asyncio.run(burst_ms(args.pulls, args.reps, on)))
    summary = {
        name: statistics.median(r["median_ms"] for r in rounds) for name, rounds in out.items()
    }
    print(json.dumps({"pulls": args.pulls, "rounds": out, "median_ms": summary}, indent=1))


if __name__ == "__main__":
    main()
