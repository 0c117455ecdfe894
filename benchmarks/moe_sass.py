"""The fused MoE's grouped-GEMM kernels compiled for an H100 (sm_90) on a machine without a
GPU: registers, spills and the SASS of the K loop, per MXFP4 mode and tile. Prints one JSON
line per kernel.

    python benchmarks/moe_sass.py bits:32,64,128,4,3 bits:32,64,128,4,2,80 scaled:64,64,64,4,3

Triton compiles for a named target without a device, and its wheel carries ptxas and
cuobjdump. The kernels are specialized as a real launch specializes them (pointers 16-byte
aligned, integer arguments divisible by 16 except the pair count) in GPT-OSS-20B's shapes
(hidden = intermediate = 2,880, 32 experts, top-4). The K loop is taken to be the longest
backward branch of the SASS (a heuristic: check `loop_instructions` against the kernel's
size). `per_value` divides the loop's instructions by the weight values one thread
dequantizes in one iteration. How this session found that `tl.dot_scaled`'s emulated
upcast, not memory, bounded the MoE at batch 256 (benchmarks/README.md, issue 16, sixth
session): timings still need the GPU.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from stator.engines.native.kernels import fused_moe as fm

_BIN = Path(triton.__file__).parent / "backends" / "nvidia" / "bin"
_UP = {"x_ptr": "*bf16", "w_ptr": "*i32", "s_ptr": "*u8", "b_ptr": "*bf16", "out_ptr": "*bf16",
       "sorted_ptr": "*i64", "block_expert_ptr": "*i64", "num_pairs": "i32", "stride_x": "i32",
       "stride_e": "i32", "stride_n": "i32", "s_stride_e": "i32", "s_stride_n": "i32",
       "alpha": "fp32", "limit": "fp32"}  # fmt: skip
_DOWN = {"h_ptr": "*bf16", "w_ptr": "*i32", "s_ptr": "*u8", "b_ptr": "*bf16",
         "route_w_ptr": "*fp32", "out_ptr": "*bf16", "sorted_ptr": "*i64",
         "block_expert_ptr": "*i64", "num_pairs": "i32", "stride_e": "i32", "stride_n": "i32",
         "s_stride_e": "i32", "s_stride_n": "i32"}  # fmt: skip
_LINE = re.compile(r"^\s+/\*([0-9a-f]+)\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)([^;]*);", re.M)


def available() -> bool:
    return (_BIN / "ptxas").exists() and (_BIN / "cuobjdump").exists()


def compile_kernel(
    kernel, signature: dict, constexprs: dict, warps: int, stages: int, maxnreg: int | None = None
):
    names = list(kernel.arg_names)
    attrs = {
        (names.index(a),): [["tt.divisibility", 16]]
        for a, ty in signature.items()
        if ty.startswith("*") or (ty == "i32" and a != "num_pairs")
    }
    src = ASTSource(
        fn=kernel,
        signature={a: signature.get(a, "constexpr") for a in names},
        constexprs={(names.index(a),): v for a, v in constexprs.items()},
        attrs=attrs,
    )
    options = {"num_warps": warps, "num_stages": stages}
    if maxnreg is not None:  # a tile's register cap (fused_moe._config)
        options["maxnreg"] = maxnreg
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options=options)


def assemble(compiled) -> tuple[int | None, int | None, str]:
    """ptxas (sm_90a) on a compiled kernel's PTX: its registers and spill-store bytes as
    ptxas reports them, and the SASS (cuobjdump)."""
    with tempfile.TemporaryDirectory() as tmp:
        ptx, cubin = Path(tmp) / "k.ptx", Path(tmp) / "k.cubin"
        ptx.write_text(compiled.asm["ptx"])
        done = subprocess.run(
            [_BIN / "ptxas", "-v", "--gpu-name", "sm_90a", ptx, "-o", cubin],
            capture_output=True, text=True, check=True,
        )  # fmt: skip
        sass = subprocess.run(
            [_BIN / "cuobjdump", "-sass", cubin], capture_output=True, text=True, check=True
        ).stdout
    regs = re.search(r"Used (\d+) registers", done.stderr)
    spills = re.search(r"(\d+) bytes spill stores", done.stderr)
    return (int(regs.group(1)) if regs else None, int(spills.group(1)) if spills else None, sass)


def loop_opcodes(sass: str) -> tuple[Counter, int]:
    """Opcode counts of the longest backward branch's body, and the kernel's length."""
    lines = [(int(a, 16), op, rest) for a, op, rest in _LINE.findall(sass)]
    best = (0, 0)
    for i, (addr, op, rest) in enumerate(lines):
        target = re.search(r"0x([0-9a-f]+)", rest) if op.startswith("BRA") else None
        if target and int(target.group(1), 16) < addr:
            j = next(k for k, line in enumerate(lines) if line[0] >= int(target.group(1), 16))
            if i - j > best[1] - best[0]:
                best = (j, i)
    return Counter(op for _, op, _ in lines[best[0] : best[1] + 1]), len(lines)


def inspect(mode: str, tile: tuple, which: str) -> dict:
    """Registers, spills, shared memory and K-loop SASS of the up or down kernel of `mode` at
    `tile` (BLOCK_M, BLOCK_N, BLOCK_K, warps, stages[, register cap])."""
    block_m, block_n, block_k, warps, stages = tile[:5]
    maxnreg = tile[5] if len(tile) > 5 else None
    common = {"LOCAL": 32, "hidden": 2880, "inter": 2880, "BLOCK_M": block_m,
              "BLOCK_N": block_n, "BLOCK_K": block_k, "PACKED": True, "MX": fm._MX[mode],
              "PRECISION": "tf32", "ASM": True}  # fmt: skip
    if which == "up":
        kernel, signature, consts = fm._moe_up_kernel, dict(_UP), {**common, "TOP_K": 4}
    else:
        kernel, signature, consts = fm._moe_down_kernel, dict(_DOWN), common
    if mode in ("scaled", "bytes"):
        signature["w_ptr"] = "*u8"
    compiled = compile_kernel(kernel, signature, consts, warps, stages, maxnreg)
    regs, spills, sass = assemble(compiled)
    ops, total = loop_opcodes(sass)
    loop = sum(ops.values())
    # weight values one thread dequantizes an iteration (the up kernel: gate and up tiles)
    values = (2 if which == "up" else 1) * block_n * block_k / (32 * warps)
    return {"mode": mode, "tile": tile, "kernel": which,
            "registers": regs, "spill_bytes": spills,
            "shared_bytes": compiled.metadata.shared,
            "programs_per_sm": programs_per_sm(regs, compiled.metadata.shared, warps),
            "kernel_instructions": total, "loop_instructions": loop,
            "per_value": round(loop / values, 2),
            "loop_opcodes": dict(_by_family(ops).most_common(16))}  # fmt: skip


def programs_per_sm(registers: int, shared: int, warps: int) -> int:
    """Programs an H100 SM holds at once: 64k registers allocated 8 a thread at a time,
    228 KiB of shared memory (1 KiB reserved a program), 64 warps, 32 programs."""
    by_registers = 65536 // (-(-registers // 8) * 8 * 32 * warps)
    return min(by_registers, 228 * 1024 // (shared + 1024), 64 // warps, 32)


def _by_family(ops: Counter) -> Counter:
    """Opcodes without modifiers, except the memory and MMA ones (their widths tell)."""
    family: Counter = Counter()
    for op, n in ops.items():
        family[op if op.startswith(("LDG", "STS", "LDS", "HGMMA")) else op.split(".")[0]] += n
    return family


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "configs", nargs="+", help="mode:BLOCK_M,BLOCK_N,BLOCK_K,warps,stages[,register cap]"
    )
    args = ap.parse_args()
    if not available():
        sys.exit(f"no ptxas / cuobjdump under {_BIN}")
    for config in args.configs:
        mode, numbers = config.split(":")
        tile = tuple(int(v) for v in numbers.split(","))
        for which in ("up", "down"):
            print(json.dumps(inspect(mode, tile, which)), flush=True)


if __name__ == "__main__":
    os.environ.pop("TRITON_INTERPRET", None)
    main()
