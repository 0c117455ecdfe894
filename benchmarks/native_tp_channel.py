"""The host cost a tensor-parallel step adds before rank 1 can launch it: rank 0 packs the
step (`StepChannel.send`: header and payload broadcasts over gloo) and rank 1 receives and
unpacks it (`StepChannel.recv`), on two CPU processes over loopback TCP.

    flock /work/bench.lock python benchmarks/native_tp_channel.py [--batch 1 32] [--steps 2000]

Per batch size: microseconds per step for (a) send + recv + a one-element answer back from
rank 1 (a round trip), (b) the answer alone (a bare gloo round trip of one broadcast each
way), and (a - b), the step's one-way cost over a bare message. Decode steps: one token per
sequence, 16-block tables (256 tokens of context).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from stator.engines.native import parallel
from stator.engines.native.context import StepContext
from stator.engines.native.model_runner import StepInputs
from stator.engines.native.step_channel import StepChannel

CPU = torch.device("cpu")


def decode_step(batch: int, blocks: int = 16) -> StepInputs:
    ar = torch.arange(batch)
    ctx = StepContext(
        positions=torch.full((batch,), 255),
        slot_mapping=ar * blocks * 16 + 255,
        block_tables=torch.arange(batch * blocks).view(batch, blocks),
        query_lens=torch.ones(batch, dtype=torch.long),
        seq_lens=torch.full((batch,), 256),
        cu_query_lens=torch.arange(batch + 1),
        max_query_len=1,
        max_seq_len=256,
        block_size=16,
        uniform=True,
        num_leading_single=batch,
    )
    return StepInputs(input_ids=ar + 10, ctx=ctx, logits_rows=ar, plain_decode=True)


def answer() -> None:
    dist.broadcast(torch.zeros(1, dtype=torch.long), 1, group=parallel.host_group())


def rank1(port: int, batches: list[int], steps: int) -> None:
    parallel.init(1, 2, port, CPU, None)
    channel = StepChannel(CPU)
    for _ in batches:
        for _ in range(2 * steps):  # with the step, then the answer alone
            if channel.recv() is None:
                break
            answer()
        for _ in range(2 * steps):
            answer()
    channel.recv()  # the STOP
    parallel.destroy()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 32])
    ap.add_argument("--steps", type=int, default=2000)
    args = ap.parse_args()
    torch.set_num_threads(1)
    store = parallel.create_store(2)
    os.environ["OMP_NUM_THREADS"] = "1"
    ctx = mp.get_context("spawn")
    proc = ctx.Process(target=rank1, args=(store.port, args.batch, args.steps))
    proc.start()
    parallel.init(0, 2, store.port, CPU, store)
    channel = StepChannel(CPU)
    print("| batch | step + answer µs | answer alone µs | step one-way µs |")
    print("|---|---|---|---|")
    for batch in args.batch:
        inputs = decode_step(batch)
        for _ in range(args.steps):  # warm-up
            channel.send(inputs)
            answer()
        start = time.perf_counter()
        for _ in range(args.steps):
            channel.send(inputs)
            answer()
        with_step = 1e6 * (time.perf_counter() - start) / args.steps
        for _ in range(args.steps):
            answer()
        start = time.perf_counter()
        for _ in range(args.steps):
            answer()
        bare = 1e6 * (time.perf_counter() - start) / args.steps
        print(f"| {batch} | {with_step:.1f} | {bare:.1f} | {with_step - bare:.1f} |")
    channel.send_stop()
    proc.join(60)
    parallel.destroy()


if __name__ == "__main__":
    main()
