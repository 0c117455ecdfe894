"""Where a small KV pull's time goes, two GPUs, one process (issue 15: the engine's
1k-token pulls paid a fixed ~0.8 ms that the same `copy_blocks` in a loop did not).

The engine's copy (the `pull` kernel on GPU 1 reading a pool on GPU 0, 8B-shaped, scattered
block ids) timed in the ways it can differ from a loop: back to back (`loop`), after an
idle gap (`idle`), from a worker thread on its own stream after an idle gap, as the transfer
agent runs it (`thread_idle`), with fresh block ids each time (`fresh`), both
(`fresh_idle`), and after an idle gap with the copy queued behind a 0.5 ms spin kernel so
the launch is off the clock (`idle_queued`: device time is then the kernel's alone). Each:
host wall time (call to synchronize) and device time (CUDA events around the call).

    python benchmarks/disagg_pull_path.py --out pull_path.json      # on the device
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from stator.kv.block_copy import pool_shape
from stator.kv.transfer.copy import copy_blocks

LAYERS, HEADS, DIM, BS = 32, 8, 128, 16
SIZES = [1024, 8192, 32768]
IDLE_S = 0.2
SPIN_CYCLES = 1_000_000  # ~0.5 ms of torch.cuda._sleep


def one_copy(src, dst, remote, local, stream, spin: bool = False) -> tuple[float, float]:
    """(wall seconds, device seconds) of one copy on `stream` of GPU 1."""
    begin = torch.cuda.Event(enable_timing=True)
    end = torch.cuda.Event(enable_timing=True)
    started = time.perf_counter()
    with torch.cuda.device(1), torch.cuda.stream(stream):
        if spin:
            torch.cuda._sleep(SPIN_CYCLES)
        begin.record()
        copy_blocks(src, dst, remote, local, "pull")
        end.record()
    stream.synchronize()
    wall = time.perf_counter() - started
    return wall, begin.elapsed_time(end) / 1e3


def measure(src, dst, n: int, blocks: int, reps: int) -> dict:
    rng = random.Random(n)
    fixed = (rng.sample(range(blocks), n), rng.sample(range(blocks), n))
    stream = torch.cuda.Stream(1)
    pool = ThreadPoolExecutor(max_workers=4)
    nbytes = n * 2 * LAYERS * BS * HEADS * DIM * 2

    def fresh():
        return rng.sample(range(blocks), n), rng.sample(range(blocks), n)

    modes = {
        "loop": lambda: one_copy(src, dst, *fixed, stream),
        "idle": lambda: (time.sleep(IDLE_S), one_copy(src, dst, *fixed, stream))[1],
        "thread_idle": lambda: (
            time.sleep(IDLE_S),
            pool.submit(one_copy, src, dst, *fixed, stream).result(),
        )[1],
        "fresh": lambda: one_copy(src, dst, *fresh(), stream),
        "fresh_idle": lambda: (time.sleep(IDLE_S), one_copy(src, dst, *fresh(), stream))[1],
        "idle_queued": lambda: (
            time.sleep(IDLE_S),
            one_copy(src, dst, *fixed, stream, spin=True),
        )[1],
    }
    out = {}
    for name, run in modes.items():
        run()  # warm-up (Triton compile, peer access, the thread's CUDA state)
        rows = [run() for _ in range(reps)]
        walls = [w for w, _ in rows]
        devices = [d for _, d in rows]
        out[name] = {
            "wall_ms_median": statistics.median(walls) * 1e3,
            "wall_ms_best": min(walls) * 1e3,
            "device_ms_median": statistics.median(devices) * 1e3,
            "GBps_median": nbytes / statistics.median(walls) / 1e9,
        }
    pool.shutdown()
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, default=Path("pull_path.json"))
    ap.add_argument("--reps", type=int, default=7)
    args = ap.parse_args()
    blocks = SIZES[-1] // BS * 2
    shape = pool_shape(LAYERS, blocks, BS, HEADS, DIM)
    src = torch.randn(shape, dtype=torch.bfloat16, device="cuda:0")
    dst = torch.zeros(shape, dtype=torch.bfloat16, device="cuda:1")
    res: dict = {"device": torch.cuda.get_device_name(0), "idle_s": IDLE_S}
    for n in SIZES:
        res[str(n)] = measure(src, dst, n // BS, blocks, args.reps)
        print(n, json.dumps(res[str(n)]), flush=True)
        args.out.write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
