"""The engine's start-up heap, kept out of the cyclic garbage collector's walk."""

from __future__ import annotations

import gc


def freeze_startup_heap() -> None:
    """Move every object alive now (the model, its graphs, compiled kernels, the imports:
    hundreds of thousands with torch and Triton loaded) out of the cyclic collector's
    reach. They live as long as the engine, yet each full collection walked them all: on an
    H100 run of 1,000 requests (`benchmarks/step_ledger.py`, 2026-11-28) two or three steps
    a run stalled 185-371 ms in a full collection; frozen, 38-116 ms (what is left walks
    the objects the run made). vLLM's engine core freezes its start-up heap the same way.
    Objects made later (requests, steps) are collected as before; a frozen object freed by
    its reference count is freed as before."""
    gc.collect()
    gc.freeze()
