"""The all-reduce of a tensor-parallel decode step on 2+ GPUs, alone: one [rows, 4096] bf16
row block (a Llama-3.1-8B hidden state), summed over every GPU of the host, 65 times in a
row (2 per layer + the embedding), the way a decode step issues them.

    python benchmarks/native_gpu_allreduce.py [--rows 1 32] [--gpus 2]

Variants, each reported per all-reduce (µs) and per 65 (ms), or with the error it raised:
- eager: `dist.all_reduce` (ProcessGroupNCCL) launched from Python each time;
- symm-graph: torch's symmetric-memory one-shot all-reduce (CUDA IPC peer loads, no
  NVLink multicast), the 65 captured in one CUDA graph, replayed (what the engine's
  decode graphs use: `graph_collectives.py`);
- nccl-graph: the 65 NCCL all-reduces captured in one CUDA graph, replayed (last: inside
  the engine's graphs these hung). Run it under `timeout`.
Every variant checks its sum first. Each rank is a process (torch.multiprocessing). Its one
run so far (2026-11-21 22:04) died of a bug of this script since fixed (a graph's buffer
freed before its replay); not re-run.
"""

from __future__ import annotations

import argparse
import datetime
import os
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

CALLS = 65
HIDDEN = 4096
MULTICAST_OFF = {
    "NCCL_NVLS_ENABLE": "0",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
    "NVSHMEM_DISABLE_NVLS": "1",
}


def timed(fn, iters: int = 50) -> float:
    """Milliseconds per call of `fn` (after warm-up), started together on every rank."""
    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    dist.barrier()
    start = time.perf_counter()
    for _ in range(iters):
        fn()
    torch.cuda.synchronize()
    return 1e3 * (time.perf_counter() - start) / iters


def captured(step):
    """`step` run once eagerly (communicator, workspace), then captured; its replay."""
    step()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()

    def replay() -> None:
        # Holds `step`, and with it the buffers the graph reads: freed, the replay would
        # read freed memory (the first run of this script died of exactly that).
        graph.replay()

    replay.step = step  # type: ignore[attr-defined]
    return replay


def make(name: str, x: torch.Tensor, calls: int, group_name: str):
    """A callable that all-reduces `x` in place `calls` times, the `name` way."""
    if name == "symm-graph":
        import torch.distributed._symmetric_memory as symm_mem

        enable = getattr(symm_mem, "enable_symm_mem_for_group", None)  # older torch
        if enable is not None:
            enable(group_name)
        buf = symm_mem.empty(x.shape, dtype=x.dtype, device=x.device)
        symm_mem.rendezvous(buf, group_name)

        def step() -> None:
            for _ in range(calls):
                buf.copy_(x)
                torch.ops.symm_mem.one_shot_all_reduce_out(buf, "sum", group_name, x)

        return captured(step)

    def nccl() -> None:
        for _ in range(calls):
            dist.all_reduce(x)

    return nccl if name == "eager" else captured(nccl)


def worker(rank: int, size: int, port: int, rows_list: list[int]) -> None:
    os.environ.update(MULTICAST_OFF)
    torch.cuda.set_device(rank)
    device = torch.device("cuda", rank)
    store = dist.TCPStore("127.0.0.1", port, size, is_master=rank == 0)
    dist.init_process_group(
        "nccl",
        store=store,
        rank=rank,
        world_size=size,
        device_id=device,
        timeout=datetime.timedelta(seconds=60),
    )
    group_name = dist.group.WORLD.group_name
    results = {}
    for rows in rows_list:
        # NCCL in a graph last: it hung inside the engine's decode graphs.
        for name in ("eager", "symm-graph", "nccl-graph"):
            key = f"{name} rows={rows}"
            try:
                # The sum, checked once (ones on every rank -> size)...
                x = torch.ones((rows, HIDDEN), dtype=torch.bfloat16, device=device)
                once = make(name, x, 1, group_name)
                x.fill_(1)
                once()
                torch.cuda.synchronize()
                if not bool((x == size).all()):
                    raise AssertionError(f"wrong sum: {x.flatten()[:4].tolist()}")
                # ...then timed on zeros (which stay finite).
                x.zero_()
                ms = timed(make(name, x, CALLS, group_name))
                results[key] = f"{1e3 * ms / CALLS:.1f} us per all-reduce, {ms:.3f} ms per 65"
            except Exception as exc:  # reported; the next variant runs
                results[key] = f"FAILED: {exc!r}"[:300]
            if rank == 0:  # as it goes: a hang in the next variant keeps this line
                print(f"{key}: {results[key]}", flush=True)
            dist.barrier()
    dist.destroy_process_group()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 32])
    ap.add_argument("--gpus", type=int, default=2)
    args = ap.parse_args()
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    print(f"device: {torch.cuda.get_device_name()} x {args.gpus}", flush=True)
    mp.spawn(worker, args=(args.gpus, port, args.rows), nprocs=args.gpus, join=True)


if __name__ == "__main__":
    main()
