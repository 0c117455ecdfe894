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


def _shape(cfg: dict) -> dict:
    """Parameter counts and KV bytes per token of a Llama-shaped config (bf16)."""
    h, inter, layers = cfg["hidden_size"], cfg["intermediate_size"], cfg["num_hidden_layers"]
    kv_dim = cfg["num_key_value_heads"] * cfg["head_dim"]
    head = h * cfg["vocab_size"]
    params = layers * (2 * h * h + 2 * h * kv_dim + 3 * h * inter) + head
    return {
        "params": params,
        "head": head,
        "weight_bytes": 2 * params,
        "kv_bytes_per_token": 2 * layers * 2 * kv_dim,  # K and V, bf16
        # Causal attention's two matmuls, per (query, key) pair, all layers and heads.
        "attn_flops_per_pair": 4 * layers * cfg["num_attention_heads"] * cfg["head_dim"],
    }


def floor(lengths: list[tuple[int, int]], cfg: dict, rates: dict, max_seqs: int) -> dict:
    """The least time any engine on this device could take for these (input, output)
    lengths with at most `max_seqs` sequences a step, on the issue's cost model: a step
    costs its prompt tokens' FLOPs at the measured matmul rate plus the bytes it must read
    (every weight once, each decoding sequence's earlier KV) at the measured copy rate.

    Steps (plain decoding: speculative decoding samples several tokens a sequence a step).
    A step samples at most one token per sequence and holds at most `max_seqs`, so
    S >= ceil(sum of outputs / max_seqs): the only bound the floor used before. And a
    request's tokens are sequential (token k is the input of the step that samples token
    k + 1; the first is sampled by the step that ends its prompt), so its `o` tokens take
    `o` distinct steps: S >= the longest output. Both hold for any schedule, so S >= their
    maximum. No count is tighter: laying the requests' tokens out step by step, request
    after request, wrapping from the last step to the first (McNaughton's rule) fills
    exactly that many steps with no request twice in one step. The ShareGPT-like profile
    of seed 0 has outputs of 1,500 tokens against ceil(219,120 / 256) = 856.

    A long request's prompt first: on this model it adds no step and no time. Its prompt
    can end in the step that samples its first token, which is already one of its `o`
    steps, and prefill FLOPs are charged in full whichever steps carry them. (Order would
    matter only if a step's compute and memory time overlapped: see the roofline below.)

    KV reads. The step sampling token k >= 1 (0-based) reads the K and V of the `isl + k -
    1` positions earlier steps wrote (the old floor counted `isl + k` for every k from 0:
    `isl + o - 1` tokens more per request). Prefill FLOPs: every layer for each prompt
    token, causal attention, and the LM head for the prompt's last token only (the old
    floor counted the head for every prompt token). Decode FLOPs are not charged: a
    decode step streams its weights, and its matmuls fit under that (~4.5 of ~4.7 ms at
    256 sequences on an H100).

    What the additive model leaves out: a device can overlap a step's matmuls with its
    memory traffic (decodes riding along a prompt's chunk cost almost nothing), so a step
    costs at least the larger of the two, not their sum. `roofline` is the bound on that
    weaker model, max(all FLOPs, prompt and decode, at the matmul rate; all bytes at the
    copy rate) with the same S: lower, and a bound no schedule can beat on a device that
    computes and moves bytes no faster than the measured rates. The issue states its goal
    on the additive floor. `old` is the floor as it was (S = ceil(sum / max_seqs)), so
    earlier ratios stay comparable."""
    shape = _shape(cfg)
    prefill_flops = decode_flops = kv_read = 0.0
    out_tokens = longest = 0
    for isl, osl in lengths:
        prefill_flops += 2 * (shape["params"] - shape["head"]) * isl + 2 * shape["head"]
        prefill_flops += shape["attn_flops_per_pair"] * isl * (isl + 1) / 2
        decodes = max(0, osl - 1)
        # Positions read by the decode steps: isl + k - 1 for k = 1 .. osl - 1.
        read = decodes * isl + decodes * (decodes - 1) / 2
        kv_read += shape["kv_bytes_per_token"] * read
        decode_flops += 2 * shape["params"] * decodes + shape["attn_flops_per_pair"] * (
            read + decodes
        )
        out_tokens += osl
        longest = max(longest, osl)
    by_tokens = math.ceil(out_tokens / max_seqs)
    steps = max(by_tokens, longest)
    prefill_s = prefill_flops / rates["matmul_flops"]
    decode_s = (steps * shape["weight_bytes"] + kv_read) / rates["copy_bytes_s"]
    roofline_s = max(
        (prefill_flops + decode_flops) / rates["matmul_flops"],
        decode_s,
    )
    return {
        "prefill_s": prefill_s,
        "decode_s": decode_s,
        "seconds": prefill_s + decode_s,
        "output_tokens": out_tokens,
        "output_tok_s": out_tokens / (prefill_s + decode_s),
        "steps": steps,
        "steps_by_tokens": by_tokens,
        "longest_output": longest,
        "old": old_floor(lengths, cfg, rates, max_seqs),
        "roofline": {"seconds": roofline_s, "output_tok_s": out_tokens / roofline_s},
    }


def old_floor(lengths: list[tuple[int, int]], cfg: dict, rates: dict, max_seqs: int) -> dict:
    """The floor printed until the fifth session of 2026-11-27 (see `floor`): decode steps
    ceil(sum of outputs / max_seqs), KV read for every output token from the first, the LM
    head for every prompt token. Kept so the README's earlier ratios compare."""
    shape = _shape(cfg)
    heads_dim = cfg["num_attention_heads"] * cfg["head_dim"]
    prefill_flops = kv_read = 0.0
    out_tokens = 0
    for isl, osl in lengths:
        prefill_flops += (
            2 * shape["params"] * isl + 2 * cfg["num_hidden_layers"] * isl * isl * heads_dim
        )
        kv_read += shape["kv_bytes_per_token"] * (osl * isl + osl * (osl - 1) / 2)
        out_tokens += osl
    steps = math.ceil(out_tokens / max_seqs)
    seconds = (
        prefill_flops / rates["matmul_flops"]
        + (steps * shape["weight_bytes"] + kv_read) / rates["copy_bytes_s"]
    )
    return {"seconds": seconds, "output_tok_s": out_tokens / seconds, "steps": steps}
