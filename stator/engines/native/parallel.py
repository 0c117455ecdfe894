"""The tensor-parallel process group of one engine and the collectives the model uses.

One engine per process joins one group: rank 0 (the worker process, which schedules and
samples) creates the rendezvous store and ranks 1..N-1 (its subprocesses) connect to it.
The model's collectives run on the default group: NCCL on CUDA, gloo on the CPU, except
inside a CUDA graph being captured, where they run on symmetric memory
(`graph_collectives.py`; ProcessGroupNCCL collectives captured in decode graphs hung on the
device). Step metadata goes over a second, gloo group on the host (`host_group`), so
receiving a step never waits on the GPU.
"""

from __future__ import annotations

import datetime
import logging
import os

import torch
import torch.distributed as dist

from stator.engines.native.graph_collectives import GraphCollectives

log = logging.getLogger(__name__)

# NVLink multicast (NVLS) stays off: on shared multi-GPU hosts a program using it can put
# every GPU of the host out of service. Set before NCCL starts; subprocesses inherit them.
MULTICAST_OFF = {
    "NCCL_NVLS_ENABLE": "0",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
    "NVSHMEM_DISABLE_NVLS": "1",
}

# A rank that stops answering (crashed peer, wedged GPU) fails a collective after this long
# instead of hanging it forever.
TIMEOUT = datetime.timedelta(minutes=10)

_host_group: dist.ProcessGroup | None = None
_graph: GraphCollectives | None = None


def create_store(size: int) -> dist.TCPStore:
    """Rank 0's rendezvous store on a free loopback port (read back as `store.port`)."""
    return dist.TCPStore("127.0.0.1", 0, size, is_master=True, wait_for_workers=False)


def init(rank: int, size: int, port: int, device: torch.device, store: dist.Store | None) -> None:
    """Join the group (blocks until every rank has joined). Rank 0 passes its store."""
    global _host_group
    if dist.is_initialized():
        raise RuntimeError(
            "a tensor-parallel group already exists in this process (one engine per process)"
        )
    for key, value in MULTICAST_OFF.items():
        os.environ.setdefault(key, value)
    if store is None:
        store = dist.TCPStore("127.0.0.1", port, size, is_master=False, timeout=TIMEOUT)
        store.set(joined_key(rank), "1")
    backend = "nccl" if device.type == "cuda" else "gloo"
    kwargs = {"device_id": device} if device.type == "cuda" else {}
    dist.init_process_group(
        backend, store=store, rank=rank, world_size=size, timeout=TIMEOUT, **kwargs
    )
    _host_group = dist.new_group(backend="gloo") if backend != "gloo" else dist.group.WORLD
    log.info("tensor-parallel rank %d of %d joined (%s)", rank, size, backend)


def joined_key(rank: int) -> str:
    """The store key a rank sets once it reached the store (rank 0 waits for them)."""
    return f"stator/tp/joined/{rank}"


def is_initialized() -> bool:
    return dist.is_initialized()


def host_group() -> dist.ProcessGroup:
    if _host_group is None:
        raise RuntimeError("no tensor-parallel group in this process")
    return _host_group


def enable_graph_collectives(numel: int, dtype: torch.dtype, device: torch.device) -> None:
    """Before capturing decode graphs (every rank, in lockstep): collectives captured in a
    graph run on symmetric memory, operands of up to `numel` elements."""
    global _graph
    _graph = GraphCollectives(numel, dtype, device)


def destroy() -> None:
    global _host_group, _graph
    _graph = None
    if dist.is_initialized():
        dist.destroy_process_group()
    _host_group = None


def abort() -> None:
    """Make collectives blocked on a dead peer fail instead of waiting for the timeout."""
    if not dist.is_initialized():
        return
    try:
        backend = dist.group.WORLD._get_backend(torch.device("cuda"))  # type: ignore[union-attr]
        backend.abort()  # type: ignore[attr-defined]
    except (RuntimeError, AttributeError, ValueError) as exc:
        # gloo fails on its own once the peer's sockets close; nothing to abort there.
        log.debug("no NCCL communicator to abort: %r", exc)


# -- collectives of the forward pass --------------------------------------------------------


def _in_graph(x: torch.Tensor) -> GraphCollectives | None:
    """The graph collectives when a CUDA graph is being captured, else None (NCCL)."""
    if x.device.type != "cuda" or not torch.cuda.is_current_stream_capturing():
        return None
    if _graph is None or not _graph.fits(x):
        # A ProcessGroupNCCL collective in a decode graph hung on the device: never capture one.
        raise RuntimeError(
            f"no graph-safe collective for a {tuple(x.shape)} {x.dtype} operand in a CUDA graph"
        )
    return _graph


def all_reduce(x: torch.Tensor) -> torch.Tensor:
    """Sum over ranks, in place."""
    graph = _in_graph(x)
    if graph is not None:
        return graph.all_reduce(x)
    dist.all_reduce(x)
    return x


def all_gather_last(x: torch.Tensor, size: int) -> torch.Tensor:
    """[T, n] on every rank -> [T, size * n], rank r's columns in block r."""
    graph = _in_graph(x)
    if graph is not None:
        return graph.all_gather_last(x)
    out = torch.empty((size * x.shape[0], x.shape[1]), dtype=x.dtype, device=x.device)
    gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    gather(out, x.contiguous())
    return out.view(size, x.shape[0], x.shape[1]).permute(1, 0, 2).reshape(x.shape[0], -1)


def min_over_ranks(value: int) -> int:
    """The smallest of every rank's `value` (e.g. KV blocks that fit on every GPU)."""
    t = torch.tensor([value], dtype=torch.long)
    dist.all_reduce(t, op=dist.ReduceOp.MIN, group=host_group())
    return int(t.item())
