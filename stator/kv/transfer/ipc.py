"""A CUDA KV pool shared with another process of the same host through CUDA IPC, the
way `torch.multiprocessing` shares CUDA tensors (a memory handle plus offsets), and
opened there on the device that holds it.

Processes number GPUs by their own CUDA_VISIBLE_DEVICES, so the exporter sends its GPU's
UUID along and the importer opens the handle under its own index of that GPU: the pool is
then a tensor of the peer device, and a `copy_` into the importer's pool is a
device-to-device copy over NVLink. When the importer cannot see that GPU, the handle is
opened under the importer's own device instead (peer-mapped memory read by its kernels).
The exporter must keep the pool alive while it is shared (the engine holds it for its
lifetime).
"""

from __future__ import annotations

import pickle

import torch
from torch.multiprocessing.reductions import rebuild_cuda_tensor, reduce_tensor

_DEVICE_ARG = 6  # position of `storage_device` in rebuild_cuda_tensor's arguments


def device_uuid(index: int) -> str:
    return str(torch.cuda.get_device_properties(index).uuid)


def export_pool(pool: torch.Tensor) -> bytes:
    if not pool.is_cuda:
        raise ValueError("only CUDA pools are shared through CUDA IPC")
    rebuild, args = reduce_tensor(pool)
    if rebuild is not rebuild_cuda_tensor:
        raise ValueError(f"unexpected CUDA tensor reduction {rebuild!r}")
    return pickle.dumps({"args": args, "uuid": device_uuid(pool.device.index or 0)})


def open_pool(handle: bytes, device: torch.device, here: bool = False) -> torch.Tensor:
    """The exporter's pool, mapped into this process (see the module docstring); with
    `here`, always mapped in `device`'s context (peer memory its kernels can address)."""
    shared = pickle.loads(handle)  # a handle from a worker of our own fleet
    args = list(shared["args"])
    local = [i for i in range(torch.cuda.device_count()) if device_uuid(i) == shared["uuid"]]
    args[_DEVICE_ARG] = local[0] if local and not here else (device.index or 0)
    with torch.cuda.device(args[_DEVICE_ARG]):
        pool = rebuild_cuda_tensor(*args)
    if not isinstance(pool, torch.Tensor) or not pool.is_cuda:
        raise ValueError("the CUDA IPC handle did not open a CUDA tensor")
    return pool
