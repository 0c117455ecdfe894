"""Tensor parallelism for the engine core: `make_runner` builds one model runner per rank.

Rank 0 is the runner the engine core drives in the worker process (it schedules and
samples); ranks 1..N-1 are subprocesses (`rank_worker.py`) that build the same runner on
their own GPU and run every step rank 0 broadcasts (`step_channel.py`). All ranks build
in lockstep, so the collectives of construction line up: the warm-up step (CUDA) and the
KV cache size (the smallest any GPU can hold).

The subprocesses die with rank 0: each watches its stdin, a pipe rank 0 holds open, and
exits when it closes (rank 0 stopped or was killed). Rank 0 watches them in turn and fails
the group's collectives if one exits unasked.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import torch

from stator.engines.native import parallel
from stator.engines.native.attention import AttentionBackend
from stator.engines.native.config import ModelSpec, NativeConfig
from stator.engines.native.model_runner import ModelRunner, StepInputs, resolve_device
from stator.engines.native.sharding import check_divisible, shard_spec
from stator.engines.native.step_channel import StepChannel

log = logging.getLogger(__name__)

_REPO_ROOT = Path(__file__).resolve().parents[3]
_STOP_GRACE_S = 30.0
_JOIN_POLL_S = 0.5


class ShardedModelRunner(ModelRunner):
    """A model runner holding one rank's shard. On rank 0, once `group` is set, every
    step is first broadcast to the other ranks."""

    group: RankGroup | None = None

    def _prepare_graphs(self, max_batch: int) -> None:
        # The largest operand of a decode graph: the hidden rows, or the gathered logits.
        spec = self.spec
        per_rank = spec.tp.vocab_block(spec.vocab_size)[1]
        numel = max_batch * max(spec.hidden_size, spec.tp.size * per_rank)
        parallel.enable_graph_collectives(numel, self.dtype, self.device)

    def _size_kv_cache(self, max_model_len: int, activation_peak: int) -> int:
        return parallel.min_over_ranks(super()._size_kv_cache(max_model_len, activation_peak))

    def execute(self, inputs: StepInputs) -> torch.Tensor:
        if self.group is not None:
            self.group.broadcast_step(inputs)
        return super().execute(inputs)

    def serve(self) -> None:
        """Ranks 1..N-1: run the steps rank 0 sends until it stops the group."""
        channel = StepChannel(self.device)
        while (inputs := channel.recv()) is not None:
            super().execute(inputs)

    def close(self) -> None:
        if self.group is not None:
            self.group.stop()
            self.group = None


def make_runner(
    spec: ModelSpec,
    config: NativeConfig,
    model_dir: str | Path,
    max_model_len: int,
    backend: AttentionBackend | None = None,
) -> ModelRunner:
    size = config.tensor_parallel_size
    check_divisible(spec, size)
    if size == 1:
        return ModelRunner(spec, config, model_dir, max_model_len, backend)
    if backend is not None:
        raise ValueError("an injected attention backend cannot reach the other ranks")
    device = rank_device(config, 0)
    group = RankGroup(config, model_dir, max_model_len, device)
    try:
        runner = ShardedModelRunner(shard_spec(spec, 0, size), config, model_dir, max_model_len)
    except BaseException:
        # The ranks may sit in another collective of the build: no STOP message, only EOF.
        group.stop(graceful=False)
        raise
    runner.group = group
    return runner


def rank_device(config: NativeConfig, rank: int) -> torch.device:
    device = resolve_device(config.device)
    if device.type != "cuda":
        return device
    count = torch.cuda.device_count()
    if config.tensor_parallel_size > count:
        raise ValueError(
            f"--tensor-parallel-size {config.tensor_parallel_size} needs as many GPUs; "
            f"{count} visible"
        )
    torch.cuda.set_device(rank)
    return torch.device("cuda", rank)


class RankGroup:
    """Rank 0's handle on the group: starts ranks 1..N-1, joins the process group with
    them, sends steps, and stops them."""

    def __init__(
        self, config: NativeConfig, model_dir: str | Path, max_model_len: int, device: torch.device
    ) -> None:
        size = config.tensor_parallel_size
        self.store = parallel.create_store(size)
        self.procs: list[subprocess.Popen[bytes]] = []
        self.stopping = False
        self.failure: str | None = None
        self.channel = StepChannel(device)
        args = json.dumps(
            {
                "size": size,
                "port": self.store.port,
                "config": dataclasses.asdict(config),
                "model_dir": str(model_dir),
                "max_model_len": max_model_len,
            }
        )
        env = {**os.environ, **parallel.MULTICAST_OFF}
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(_REPO_ROOT), env.get("PYTHONPATH", "")) if p
        )
        try:
            for rank in range(1, size):
                cmd = [sys.executable, "-m", "stator.engines.native.rank_worker", str(rank), args]
                # stdin stays open for the rank's whole life: its EOF tells the rank that
                # rank 0 is gone, however it went.
                self.procs.append(subprocess.Popen(cmd, stdin=subprocess.PIPE, env=env))
            self._wait_for_ranks(size)
            threading.Thread(target=self._watch, name="tp-rank-watch", daemon=True).start()
            parallel.init(0, size, self.store.port, device, self.store)
        except BaseException:
            self.stop()
            raise

    def _wait_for_ranks(self, size: int) -> None:
        """Until every rank has reached the store (a rank that dies first is an error, not a
        hang on the rendezvous)."""
        keys = [parallel.joined_key(rank) for rank in range(1, size)]
        deadline = time.monotonic() + parallel.TIMEOUT.total_seconds()
        while not all(self.store.check([k]) for k in keys):
            self._raise_if_exited()
            if time.monotonic() > deadline:
                raise RuntimeError("tensor-parallel ranks did not start in time")
            time.sleep(_JOIN_POLL_S)

    def _raise_if_exited(self) -> None:
        for rank, proc in enumerate(self.procs, start=1):
            code = proc.poll()
            if code is not None:
                raise RuntimeError(f"tensor-parallel rank {rank} exited with code {code}")

    def _watch(self) -> None:
        while not self.stopping:
            for rank, proc in enumerate(self.procs, start=1):
                code = proc.poll()
                if code is not None and not self.stopping:
                    self.failure = f"tensor-parallel rank {rank} exited with code {code}"
                    log.error("%s; failing the group's collectives", self.failure)
                    parallel.abort()
                    return
            time.sleep(_JOIN_POLL_S)

    def broadcast_step(self, inputs: StepInputs) -> None:
        if self.failure is not None:
            raise RuntimeError(self.failure)
        self.channel.send(inputs)

    def stop(self, graceful: bool = True) -> None:
        """Stop every rank (a STOP message, then closing their stdin) and leave the group."""
        if self.stopping:
            return
        self.stopping = True
        if graceful and parallel.is_initialized() and self.failure is None:
            try:
                self.channel.send_stop()
            except RuntimeError as exc:  # a rank already gone: closing stdin ends the rest
                log.warning("could not send STOP to the tensor-parallel ranks: %r", exc)
        for proc in self.procs:
            if proc.stdin is not None:
                proc.stdin.close()
        deadline = time.monotonic() + _STOP_GRACE_S
        for proc in self.procs:
            try:
                proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                log.warning("tensor-parallel rank pid %d did not stop; killing it", proc.pid)
                proc.kill()
                proc.wait()
        try:
            parallel.destroy()
        except RuntimeError as exc:  # a communicator already aborted
            log.warning("leaving the tensor-parallel group: %r", exc)
