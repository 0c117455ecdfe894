"""Programmatic dependent launch (Hopper and later), off unless `STATOR_PDL=1`: a kernel
launched with it may start while the kernel before it on the stream is still running; it
then waits (`gdc_wait`, the first thing each such kernel does, before any memory access)
until that kernel has finished and its writes are visible, so only its launch and the
scheduling of its programs overlap the previous kernel's last programs.

Every kernel launched this way waits before touching memory, so ordering is that of
plain launches (a kernel two back has finished too: the one in between waited for it).
Measured on an H100 (8B shape, batch-1 decode graph of 312 kernels with the fused
epilogues): 178.8 tok/s with it against 180.1 without, the step at batch 256 0.5% slower;
hence off by default, kept for GPUs and kernel mixes where launch gaps dominate.
`ENABLED` may be flipped before graphs are captured (`benchmarks/decode_b1_profile.py`).
Never on before Hopper or in Triton's interpreter.
"""

from __future__ import annotations

import functools
import os

import torch
import triton
import triton.language as tl
import triton.language.extra.cuda  # gdc_wait, gdc_launch_dependents

from stator.engines.native.kernels import switches

ENABLED = switches.flag("STATOR_PDL", False)


@functools.cache
def _supported(index: int) -> bool:
    if os.environ.get("TRITON_INTERPRET") == "1":
        return False
    return torch.cuda.get_device_capability(index)[0] >= 9


def supported(x: torch.Tensor) -> bool:
    """Whether `x`'s device can launch kernels with PDL (Hopper or later, not Triton's
    interpreter), whatever `ENABLED` says: for a kernel pair that opts in on its own."""
    return x.is_cuda and _supported(x.device.index or 0)


def enabled(x: torch.Tensor) -> bool:
    """Whether kernels working on `x` launch with PDL (pass it as `PDL=` and `launch_pdl=`)."""
    return ENABLED and supported(x)


@triton.jit
def pdl_sync(PDL: tl.constexpr):
    """The first statement of a kernel that may be launched with PDL: wait for the previous
    kernel (and its writes), then let the next one launch."""
    if PDL:
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
