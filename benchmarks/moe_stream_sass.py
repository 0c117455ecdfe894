"""The batch-1 streaming MoE kernels compiled for an H100 (sm_90) on a machine without a GPU:
registers, spills and the K loop's SASS of moe_stream's row-tile kernels and moe_gemv's
fp16-pair kernels, per tile. Prints one JSON line per kernel.

    python benchmarks/moe_stream_sass.py rows:2,16,4 gemv:2,8,4

Specialized as the engine launches them in GPT-OSS-20B's shapes (hidden = intermediate =
2,880, 32 experts, top-4; pointers 16-byte aligned, integer arguments divisible by 16).
`per_word` divides the loop's instructions by the 32-bit weight words (8 values) one thread
handles an iteration; `barriers` counts block-wide barriers inside the loop (moe_gemv's
kernels paid two a step for the scales' layout, 2026-11-28).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.moe_sass import (
    _BIN,
    _by_family,
    assemble,
    available,
    compile_kernel,
    loop_opcodes,
)
from stator.engines.native.kernels import moe_gemv, moe_stream

_UP = {"x_ptr": "*i32", "inv_ptr": "*fp32", "ids_ptr": "*i64", "w_ptr": "*i32", "s_ptr": "*u8",
       "b_ptr": "*bf16", "out_ptr": "*fp16", "first": "i32", "stride_e": "i32",
       "s_stride_e": "i32", "alpha": "fp32", "limit": "fp32", "h_scale": "fp32"}  # fmt: skip
_DOWN = {"h_ptr": "*i32", "ids_ptr": "*i64", "route_ptr": "*fp32", "w_ptr": "*i32",
         "s_ptr": "*u8", "b_ptr": "*bf16", "out_ptr": "*bf16", "first": "i32", "stride_e": "i32",
         "s_stride_e": "i32", "h_inv": "fp32"}  # fmt: skip
__all__ = ["available", "inspect"]


def inspect(kind: str, tile: tuple[int, int, int], which: str) -> dict:
    """kind "rows" (moe_stream) or "gemv" (moe_gemv, fp16 pairs); tile (BLOCK_N, groups of
    32 values a step, warps); which "up" or "down"."""
    block_n, groups, warps = tile
    consts = {"HIDDEN": 2880, "INTER": 2880, "TOP_K": 4, "KP": 4, "LOCAL": 32,
              "BLOCK_N": block_n, "ASM": True}  # fmt: skip
    if kind == "rows":
        kernel = moe_stream._up_rows_kernel if which == "up" else moe_stream._down_rows_kernel
        consts.update(G=groups, PDL=True)
    else:
        kernel = moe_gemv._up_kernel if which == "up" else moe_gemv._down_kernel
        consts.update(BLOCK_K=groups, PACKED=True, HALF2=True)
    names = list(kernel.arg_names)
    signature = {a: t for a, t in (_UP if which == "up" else _DOWN).items() if a in names}
    compiled = compile_kernel(kernel, signature, consts, warps, 1)
    regs, spills, sass = assemble(compiled)
    ops, total = loop_opcodes(sass)
    loop = sum(ops.values())
    rows = (2 if which == "up" else 1) * block_n * 4  # 4 experts
    words = rows * groups * 4 / (32 * warps)  # a thread's words an iteration
    return {"kind": kind, "tile": tile, "kernel": which,
            "registers": regs, "spill_bytes": spills,
            "kernel_instructions": total, "loop_instructions": loop,
            "per_word": round(loop / words, 2),
            "barriers": sum(n for op, n in ops.items() if op.startswith("BAR")),
            "loop_opcodes": dict(_by_family(ops).most_common(12))}  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("configs", nargs="+", help="rows|gemv:BLOCK_N,GROUPS,WARPS")
    args = ap.parse_args()
    if not available():
        sys.exit(f"no ptxas / cuobjdump under {_BIN}")
    for config in args.configs:
        kind, numbers = config.split(":")
        tile = tuple(int(v) for v in numbers.split(","))
        for which in ("up", "down"):
            print(json.dumps(inspect(kind, tile, which)), flush=True)


if __name__ == "__main__":
    os.environ.pop("TRITON_INTERPRET", None)
    main()
