"""Length profiles for serving benchmarks, and a workload's floor on a device: the least
time any engine could take (`benchmarks/native_gpu_http_vs_engine.py` prints both)."""

from __future__ import annotations

import math
import random
import time


def heavy(n: int, seed: int = 0) -> list[tuple[int, int]]:
    rng = random.Random(f"heavy:{seed}")
    return [
        (
            min(1400, max(16, round(rng.gauss(600, 200)))),
            min(700, max(16, round(rng.gauss(350, 87)))),
        )
        for _ in range(n)
    ]


def sharegpt(n: int, seed: int = 0) -> list[tuple[int, int]]:
    """Log-normal lengths: median 120 in / 130 out, long right tails (means 221 / 219
    over the 1,000 of seed 0)."""
    rng = random.Random(f"sharegpt:{seed}")
    return [
        (
            min(3000, max(4, round(rng.lognormvariate(math.log(120), 1.1)))),
            min(1500, max(4, round(rng.lognormvariate(math.log(130), 0.95)))),
        )
        for _ in range(n)
    ]


PROFILES = {"heavy": heavy, "sharegpt": sharegpt}


def device_rates(device: str) -> dict:
    """bf16 matmul FLOP/s (8192³) and device copy bytes/s (read + written)."""
    import torch

    if device != "cuda":
        return {"matmul_flops": 1e11, "copy_bytes_s": 2e10}
    a = torch.randn(8192, 8192, dtype=torch.bfloat16, device="cuda")
    for _ in range(3):
        a @ a
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(20):
        a @ a
    torch.cuda.synchronize()
    flops = 2 * 8192**3 * 20 / (time.perf_counter() - t)
    x = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    y = torch.empty_like(x)
    for _ in range(3):
        y.copy_(x)
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(20):
        y.copy_(x)
    torch.cuda.synchronize()
    return {"matmul_flops": flops, "copy_bytes_s": 2 * x.numel() * 20 / (time.perf_counter() - t)}


def floor(lengths: list[tuple[int, int]], cfg: dict, rates: dict, max_seqs: int) -> dict:
    """The least time any engine on this device could take: prefill FLOPs at the matmul
    rate, plus decode steps (at most `max_seqs` tokens each) that stream every weight once
    and each token's context KV once, at the copy bandwidth."""
    h, inter, layers = cfg["hidden_size"], cfg["intermediate_size"], cfg["num_hidden_layers"]
    kv_dim = cfg["num_key_value_heads"] * cfg["head_dim"]
    vocab = cfg["vocab_size"]
    params = layers * (2 * h * h + 2 * h * kv_dim + 3 * h * inter) + h * vocab
    weight_bytes = 2 * params
    kv_bytes_per_token = 2 * layers * 2 * kv_dim  # K and V, bf16
    prefill_flops = 0.0
    kv_read = 0.0
    out_tokens = 0
    for isl, osl in lengths:
        prefill_flops += (
            2 * params * isl + 2 * layers * isl * isl * cfg["num_attention_heads"] * cfg["head_dim"]
        )
        kv_read += kv_bytes_per_token * (osl * isl + osl * (osl - 1) / 2)
        out_tokens += osl
    steps = math.ceil(out_tokens / max_seqs)
    prefill_s = prefill_flops / rates["matmul_flops"]
    decode_s = (steps * weight_bytes + kv_read) / rates["copy_bytes_s"]
    return {
        "prefill_s": prefill_s,
        "decode_s": decode_s,
        "seconds": prefill_s + decode_s,
        "output_tokens": out_tokens,
        "output_tok_s": out_tokens / (prefill_s + decode_s),
    }
