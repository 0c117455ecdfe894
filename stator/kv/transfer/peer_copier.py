"""`PeerCopier`: a decode agent's copies from one prefill pool (opened through CUDA IPC,
mapped in this GPU's context) into its own, with the host's share of each pull cut to a
few small calls.

A 1k-token pull moves 128 MiB, 0.34 ms at the link's ~390 GB/s; the plain path
(`copy.copy_blocks` from a worker thread) spent ~0.9 ms of host time before the copy even
started (a fresh pinned tensor of block ids, Triton's launcher binding its arguments, the
stream juggling), ~0.5 ms of it only after an idle gap. Here:

- the block ids go into one of a few pinned host buffers kept for good (numpy writes), and
  from there, in one small copy on the agent's stream, into one device buffer;
- the copy is the `COUNTED` kernel (`kernel.copy_counted`): it reads the number of pairs
  from that buffer, so one launch with a grid of `bucket(n)` pairs serves every pull of up
  to that many blocks; each bucket's launch is captured once in a CUDA graph, and a pull
  replays it (one call) instead of launching through Triton's Python launcher;
- `launch` only enqueues and returns an event: the agent calls it on its event loop
  thread and waits for the event in a worker thread (no hop before the copy starts).

Graph capture is per thread (`thread_local`), so the engine's step thread keeps running
its own work meanwhile. When a capture fails, the copier launches the kernel directly
from then on.
"""

from __future__ import annotations

import logging

import numpy as np
import torch

from stator.kv.transfer import kernel

log = logging.getLogger(__name__)

MIN_BUCKET = 16  # blocks (256 tokens of 16): smaller pulls share one graph
HOST_SLOTS = 8  # pinned id buffers in turn: a pull rewrites one only once its upload ran


def bucket(n: int) -> int:
    """The grid size (pairs) that serves `n` blocks: the next power of two, at least
    MIN_BUCKET (programs past `n` return at once)."""
    return max(MIN_BUCKET, 1 << max(0, n - 1).bit_length())


class PeerCopier:
    def __init__(
        self, src: torch.Tensor, dst: torch.Tensor, stream: torch.cuda.Stream, graphs: bool = True
    ) -> None:
        if not (src.is_cuda and dst.is_cuda and kernel.supported(src, dst)):
            raise ValueError("PeerCopier needs two CUDA pools the copy kernel supports")
        self.src, self.dst, self.stream = src, dst, stream
        self.graphs = graphs
        self._graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self._cap = 0
        self._slot = 0
        kernel.enable_peer_access(dst.device, src.device)
        self._grow(MIN_BUCKET)
        with torch.cuda.device(dst.device), torch.cuda.stream(stream):
            # Compiles the kernel now (count 0: copies nothing), never inside a capture.
            kernel.copy_counted(src, dst, self._ids, MIN_BUCKET)
        stream.synchronize()

    def _grow(self, n: int) -> None:
        if self._cap:
            self.stream.synchronize()  # queued copies still read the old buffers
        cap = bucket(n)
        words = 1 + 2 * cap
        self._ids = torch.zeros(words, dtype=torch.int32, device=self.dst.device)
        self._host = [torch.zeros(words, dtype=torch.int32).pin_memory() for _ in range(HOST_SLOTS)]
        self._host_np = [h.numpy() for h in self._host]
        self._host_read: list[torch.cuda.Event | None] = [None] * HOST_SLOTS
        self._graphs.clear()  # they hold the old buffer's address
        self._cap = cap

    def launch(
        self, remote: list[int], local: list[int]
    ) -> tuple[torch.cuda.Event, torch.cuda.Event]:
        """Enqueue the copy of blocks `remote[i]` of the source pool into `local[i]` on
        the stream; returns timing events recorded before and after it."""
        n = len(remote)
        if n > self._cap:
            self._grow(n)
        cap, slot = self._cap, self._slot
        self._slot = (slot + 1) % HOST_SLOTS
        read = self._host_read[slot]
        if read is not None and not read.query():
            # Its last upload is still queued (more than HOST_SLOTS pulls in flight): a
            # fresh buffer, not a wait on the event loop; the host allocator keeps the old
            # one until that copy is done.
            self._host[slot] = torch.zeros_like(self._host[slot]).pin_memory()
            self._host_np[slot] = self._host[slot].numpy()
        host = self._host_np[slot]
        host[0] = n
        host[1 : 1 + n] = np.asarray(remote, dtype=np.int32)
        host[1 + cap : 1 + cap + n] = np.asarray(local, dtype=np.int32)
        pairs = bucket(n)
        with torch.cuda.device(self.dst.device), torch.cuda.stream(self.stream):
            begin = torch.cuda.Event(enable_timing=True)
            begin.record()
            self._ids.copy_(self._host[slot], non_blocking=True)
            read = self._host_read[slot] = torch.cuda.Event()
            read.record()
            graph = self._graphs.get(pairs) if self.graphs else None
            if graph is None and self.graphs:
                graph = self._capture(pairs)
            if graph is not None:
                graph.replay()
            else:
                kernel.copy_counted(self.src, self.dst, self._ids, pairs)
            done = torch.cuda.Event(enable_timing=True)
            done.record()
        return begin, done

    def _capture(self, pairs: int) -> torch.cuda.CUDAGraph | None:
        graph = torch.cuda.CUDAGraph()
        side = torch.cuda.Stream(self.dst.device)
        side.wait_stream(self.stream)
        try:
            with torch.cuda.stream(side):
                graph.capture_begin(capture_error_mode="thread_local")
                try:
                    kernel.copy_counted(self.src, self.dst, self._ids, pairs)
                finally:
                    graph.capture_end()
        except Exception as exc:
            log.warning("KV copy graph capture failed (%s); launching directly", exc)
            self.graphs = False
            return None
        self.stream.wait_stream(side)
        self._graphs[pairs] = graph
        return graph
