"""A tensor-parallel rank 1..N-1: `python -m stator.engines.native.rank_worker RANK ARGS`.

Rank 0 (`tp_runner.RankGroup`) starts it with ARGS as JSON (group size, store port, the
engine config, model directory, context length). It joins the group, builds its shard of
the model in lockstep with the other ranks, then runs each step rank 0 broadcasts until
told to stop. It exits as soon as its stdin closes: that pipe's other end lives in rank 0,
so a rank never outlives the engine, even one killed without a chance to clean up.
"""

from __future__ import annotations

import faulthandler
import json
import logging
import os
import signal
import sys
import threading

import torch

from stator.engines.native import parallel, rank_transfer
from stator.engines.native.config import ModelSpec, NativeConfig
from stator.engines.native.sharding import shard_spec
from stator.engines.native.tp_runner import ShardedModelRunner, rank_device

log = logging.getLogger("stator.engines.native.rank_worker")


def exit_when_parent_is_gone() -> None:
    """Exit once stdin closes: the parent (rank 0, or the worker host of a core process)
    holds the pipe's other end, so it closes when the parent stops or dies.

    It reads the raw descriptor, not `sys.stdin.buffer`: a daemon thread blocked inside the
    buffered reader holds its lock, and the interpreter's shutdown then aborts with "Fatal
    Python error: _enter_buffered_busy" when it flushes stdin."""
    while os.read(sys.stdin.fileno(), 1 << 16):
        pass
    os._exit(0)  # the parent closed the pipe or died; a collective may be blocked: no cleanup


def main(argv: list[str]) -> int:
    rank, args = int(argv[0]), json.loads(argv[1])
    logging.basicConfig(
        level=logging.INFO, format=f"%(asctime)s tp-rank{rank} %(name)s %(message)s"
    )
    threading.Thread(target=exit_when_parent_is_gone, name="rank0-watch", daemon=True).start()
    faulthandler.register(signal.SIGUSR1, all_threads=True)  # `kill -USR1`: where it hangs
    config = NativeConfig(**args["config"])  # exactly as rank 0 runs it
    if config.cpu_threads > 0:
        torch.set_num_threads(config.cpu_threads)
    device = rank_device(config, rank)
    parallel.init(rank, args["size"], args["port"], device, None)
    spec = shard_spec(ModelSpec.from_dir(args["model_dir"]), rank, args["size"])
    runner = ShardedModelRunner(spec, config, args["model_dir"], args["max_model_len"])
    if runner.kv_pool is not None:  # prefill / decode roles: a KV transfer agent when asked
        rank_transfer.serve_when_asked(rank, args["size"], args["port"], runner.kv_pool)
    runner.serve()
    parallel.destroy()
    log.info("stopped")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
