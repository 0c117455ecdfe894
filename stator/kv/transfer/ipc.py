"""A CUDA KV pool shared with another process of the same host through CUDA IPC, the
way `torch.multiprocessing` shares CUDA tensors (a memory handle plus offsets, pickled).

The opening process maps the prefill pool's memory into its address space; the tensor it
gets is labelled with the device index the exporter used. When that index is the
importer's own device (each process lists its own GPU first in CUDA_VISIBLE_DEVICES, and
the other one second), copy kernels on the importer's GPU read the peer's memory across
NVLink directly: one pass over the link, no staging on the far side. The exporter must
keep the pool alive while it is shared (the engine holds it for its lifetime).
"""

from __future__ import annotations

import io
import pickle
from multiprocessing.reduction import ForkingPickler

import torch
import torch.multiprocessing  # registers torch's CUDA tensor reductions


def export_pool(pool: torch.Tensor) -> bytes:
    if not pool.is_cuda:
        raise ValueError("only CUDA pools are shared through CUDA IPC")
    buf = io.BytesIO()
    ForkingPickler(buf, pickle.HIGHEST_PROTOCOL).dump(pool)
    return buf.getvalue()


def open_pool(handle: bytes, device: torch.device) -> torch.Tensor:
    """The exporter's pool, mapped here (opened while `device` is current, so the peer
    mapping is made for it)."""
    with torch.cuda.device(device):
        pool = pickle.loads(handle)  # a handle from a worker of our own fleet
    if not isinstance(pool, torch.Tensor) or not pool.is_cuda:
        raise ValueError("the CUDA IPC handle did not open a CUDA tensor")
    return pool
