"""Triton kernels of the native engine (CUDA only): KV store into pages, paged decode
attention (split-K) and paged prefill/extend attention. Importing this package needs Triton;
`triton_available()` says whether the kernels can run here."""

from __future__ import annotations


def triton_available() -> bool:
    try:
        import torch
        import triton  # noqa: F401
    except ImportError:
        return False
    return torch.cuda.is_available()
