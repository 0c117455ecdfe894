"""What two transfer agents compare before a pull: whether they share a host (and its
GPUs), and whether their pools' blocks are interchangeable."""

from __future__ import annotations

import contextlib
import functools
import socket
from typing import Any

import torch


@functools.cache  # asked on every pull
def host_id() -> str:
    """Same value in two processes = they share a host (and its GPUs)."""
    boot = ""
    with contextlib.suppress(OSError):
        boot = open("/proc/sys/kernel/random/boot_id").read().strip()  # noqa: SIM115
    return f"{socket.gethostname()}/{boot}"


def layout(pool: torch.Tensor) -> list[Any]:
    """What must match between two pools for their blocks to be interchangeable."""
    layers, two, _, *rest = pool.shape
    return [layers, two, *rest, str(pool.dtype)]
