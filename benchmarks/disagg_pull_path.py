"""Where a small KV pull's time goes, two GPUs, one process (issue 15: the engine's
1k-token pulls paid a fixed ~0.8 ms that the same `copy_blocks` in a loop did not).

The engine's copy (the `pull` kernel on GPU 1 reading a pool on GPU 0, 8B-shaped, scattered
block ids) by `copy_blocks`, timed in the ways it can differ from a loop: back to back
(`loop`), after an idle gap (`idle`), from a worker thread on its own stream after an idle
gap, as the transfer agent ran it before `PeerCopier` (`thread_idle`), and after an idle
gap with the copy queued behind a 0.5 ms spin kernel so the launch is off the clock
(`idle_queued`: device time is then the kernel's alone). Each: host wall time (call to
synchronize) and device time (CUDA events around the call).

Then the same copy by a `PeerCopier` (persistent id buffers, the counted kernel), launched
directly (`copier_idle`) or replayed from a CUDA graph (`graph_idle`, `graph_loop`), and
as the agent runs it: enqueued on this thread, waited for in a pool thread
(`graph_idle_agent`). Sustained: 8 pulls of fresh ids enqueued back to back after an idle
gap, one wait (`burst8_*`: as a decode worker pulling a batch of prompts prefilled
together sees them), GB/s over the 8; and the same 8 pulls coalesced into one launch over
the union of their ids (`union8_*`: what the agent's copy batcher does with pulls pending
together). Every copier mode's copy is checked. `--modes` picks modes (default: all).

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
from stator.kv.transfer.peer_copier import PeerCopier

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


def copier_copy(copier, remote, local, wait=None) -> tuple[float, float]:
    """(wall, device seconds) of one `PeerCopier` pull: launched here, waited by `wait`."""
    started = time.perf_counter()
    begin, done = copier.launch(remote, local)
    (wait or (lambda f: f()))(done.synchronize)
    return time.perf_counter() - started, begin.elapsed_time(done) / 1e3


def burst(launch, pulls) -> tuple[float, float]:
    """8 pulls enqueued back to back, then one wait: (wall, device seconds) of all."""
    started = time.perf_counter()
    first = last = None
    for remote, local in pulls:
        begin, done = launch(remote, local)
        first, last = first or begin, done
    last.synchronize()
    return time.perf_counter() - started, first.elapsed_time(last) / 1e3


def union(pulls: list[tuple[list[int], list[int]]]) -> tuple[list[int], list[int]]:
    """Pulls as one: their ids concatenated (a burst's local ids may repeat here, as
    fresh() draws each pull's alone; the copy is timed, not checked)."""
    return [b for r, _ in pulls for b in r], [b for _, lo in pulls for b in lo]


def measure(src, dst, n: int, blocks: int, reps: int, wanted: set[str]) -> dict:
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
        "idle_queued": lambda: (
            time.sleep(IDLE_S),
            one_copy(src, dst, *fixed, stream, spin=True),
        )[1],
    }
    copiers = {
        "copier": PeerCopier(src, dst, torch.cuda.Stream(1), graphs=False),
        "graph": PeerCopier(src, dst, torch.cuda.Stream(1), graphs=True),
    }
    checks = {}
    for name, copier in copiers.items():
        for _ in range(9):  # every pinned id slot then holds n ids
            copier.launch(*fresh())[1].synchronize()
        # n - 3 pairs: the grid's last programs, whose slots hold stale ids, copy nothing.
        remote, local = (ids[:-3] for ids in fresh())
        dst.zero_()
        torch.cuda.synchronize(1)
        copier.launch(remote, local)[1].synchronize()
        untouched = sorted(set(range(blocks)) - set(local))
        checks[name] = bool(
            torch.equal(dst[:, :, local], src[:, :, remote].to(dst.device))
            and not dst[:, :, untouched].any()
        )
    copier, graph = copiers["copier"], copiers["graph"]

    def old_launch(remote, local):
        begin = torch.cuda.Event(enable_timing=True)
        done = torch.cuda.Event(enable_timing=True)
        with torch.cuda.device(1), torch.cuda.stream(stream):
            begin.record()
            copy_blocks(src, dst, remote, local, "pull")
            done.record()
        return begin, done

    def wait_in_thread(fn):
        pool.submit(fn).result()

    modes |= {
        "copier_idle": lambda: (time.sleep(IDLE_S), copier_copy(copier, *fresh()))[1],
        "graph_loop": lambda: copier_copy(graph, *fresh()),
        "graph_idle": lambda: (time.sleep(IDLE_S), copier_copy(graph, *fresh()))[1],
        "graph_idle_agent": lambda: (
            time.sleep(IDLE_S),
            copier_copy(graph, *fresh(), wait=wait_in_thread),
        )[1],
        "burst8_old_idle": lambda: (
            time.sleep(IDLE_S),
            burst(old_launch, [fresh() for _ in range(8)]),
        )[1],
        "burst8_graph_idle": lambda: (
            time.sleep(IDLE_S),
            burst(graph.launch, [fresh() for _ in range(8)]),
        )[1],
        "burst8_graph_loop": lambda: burst(graph.launch, [fresh() for _ in range(8)]),
        "union8_graph_idle": lambda: (
            time.sleep(IDLE_S),
            burst(graph.launch, [union([fresh() for _ in range(8)])]),
        )[1],
        "union8_graph_loop": lambda: burst(graph.launch, [union([fresh() for _ in range(8)])]),
    }
    if unknown := wanted - modes.keys():
        raise SystemExit(f"unknown --modes {sorted(unknown)}; known: {', '.join(modes)}")
    if wanted:
        modes = {name: run for name, run in modes.items() if name in wanted}
    out = {}
    for name, run in modes.items():
        run()  # warm-up (Triton compile, peer access, the thread's CUDA state)
        rows = [run() for _ in range(reps)]
        walls = [w for w, _ in rows]
        devices = [d for _, d in rows]
        moved = nbytes * (8 if name.startswith(("burst8", "union8")) else 1)
        out[name] = {
            "wall_ms_median": statistics.median(walls) * 1e3,
            "wall_ms_best": min(walls) * 1e3,
            "device_ms_median": statistics.median(devices) * 1e3,
            "GBps_median": moved / statistics.median(walls) / 1e9,
        }
    pool.shutdown()
    out["copier_checks"] = checks
    out["graphs_on"] = graph.graphs
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, default=Path("pull_path.json"))
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--modes", default="", help="comma-separated modes to time (default: all)")
    args = ap.parse_args()
    blocks = SIZES[-1] // BS * 2
    shape = pool_shape(LAYERS, blocks, BS, HEADS, DIM)
    src = torch.randn(shape, dtype=torch.bfloat16, device="cuda:0")
    dst = torch.zeros(shape, dtype=torch.bfloat16, device="cuda:1")
    res: dict = {"device": torch.cuda.get_device_name(0), "idle_s": IDLE_S}
    for n in SIZES:
        wanted = set(filter(None, args.modes.split(",")))
        res[str(n)] = measure(src, dst, n // BS, blocks, args.reps, wanted)
        print(n, json.dumps(res[str(n)]), flush=True)
        args.out.write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
