"""GPT-OSS on one GPU with random weights in the real shapes (`--load-format dummy`, experts
packed MXFP4 or expanded bf16; nothing downloaded). Prints one JSON document.

    python benchmarks/gpt_oss_gpu.py --model 20b [--moe-weights mxfp4 bf16] \
        [--tokenizer-json o200k_harmony.tokenizer.json] [--http-requests 1000]

Measures: the copy bandwidth; the fused MoE layer alone by batch (and a sweep of its
small-batch tile configurations; gpt_oss_moe_layer.py); per expert format, batch-1 decode tok/s (256 tokens after
a 32-token prompt) against the floor of active bytes per token over the copy bandwidth,
the median TTFT of a 2,048-token prompt on an idle engine, and decode step time by batch;
then `stator run` + `stator bench` through HTTP: N requests with the lengths of `--http-profile`
(serving_workloads.py: ShareGPT-like log-normal, or heavy ~N(600, 200) in / ~N(350, 87) out; EOS
ignored), concurrency 256, /v1/completions.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import random
import re
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.gpt_oss_moe_layer import bench_moe_layer, timed  # noqa: E402
from benchmarks.native_gpu import copy_bandwidth, drain, random_ids, request  # noqa: E402
from stator.engines.native.config import NativeConfig  # noqa: E402
from stator.engines.native.engine_core import EngineCore  # noqa: E402

SHAPES = {
    "20b": {"num_hidden_layers": 24, "num_local_experts": 32},
    "120b": {"num_hidden_layers": 36, "num_local_experts": 128},
}


def make_model_dir(root: Path, size: str, tokenizer_json: Path | None) -> Path:
    out = root / f"gpt-oss-{size}"
    out.mkdir()
    layers = SHAPES[size]["num_hidden_layers"]
    config = {
        "architectures": ["GptOssForCausalLM"],
        "model_type": "gpt_oss",
        "hidden_size": 2880,
        "intermediate_size": 2880,
        "num_experts_per_tok": 4,
        "num_attention_heads": 64,
        "num_key_value_heads": 8,
        "head_dim": 64,
        "vocab_size": 201088,
        "sliding_window": 128,
        "layer_types": ["sliding_attention", "full_attention"] * (layers // 2),
        "rope_theta": 150000,
        "rope_scaling": {
            "rope_type": "yarn",
            "factor": 32.0,
            "beta_fast": 32.0,
            "beta_slow": 1.0,
            "original_max_position_embeddings": 4096,
            "truncate": False,
        },
        "max_position_embeddings": 131072,
        "attention_bias": True,
        "rms_norm_eps": 1e-5,
        "swiglu_limit": 7.0,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "eos_token_id": 200002,
        **SHAPES[size],
    }
    (out / "config.json").write_text(json.dumps(config, indent=2))
    (out / "generation_config.json").write_text(json.dumps({"eos_token_id": [200002, 199999]}))
    if tokenizer_json is not None:
        (out / "tokenizer.json").write_bytes(tokenizer_json.read_bytes())
        (out / "tokenizer_config.json").write_text(
            json.dumps({"eos_token": "<|return|>", "pad_token": "<|endoftext|>"})
        )
    return out


def active_bytes(size: str, packed: bool) -> dict:
    layers = SHAPES[size]["num_hidden_layers"]
    hidden, heads, kv, dim, vocab = 2880, 64, 8, 64, 201088
    attn = (hidden * (heads + 2 * kv) * dim + heads * dim * hidden) * 2
    expert = 3 * 2880 * 2880 * (17 / 32 if packed else 2)
    experts_bytes = layers * 4 * expert
    head = vocab * hidden * 2
    total = layers * attn + experts_bytes + head + hidden * 2
    return {"attention": layers * attn, "experts": experts_bytes, "lm_head": head, "total": total}


def bench_engine(args, model_dir: Path, size: str, moe_weights: str, bandwidth: float) -> dict:
    config = NativeConfig(
        device="cuda", dtype="bfloat16", load_format="dummy", moe_weights=moe_weights,
        max_model_len=args.max_model_len, max_num_seqs=256, max_num_batched_tokens=8192,
        gpu_memory_utilization=args.gpu_memory_utilization,
    )  # fmt: skip
    t0 = time.perf_counter()
    core = EngineCore(config, model_dir)
    res: dict = {"startup_s": round(time.perf_counter() - t0, 1),
                 "kv_blocks": core.blocks.num_blocks,
                 "weights_gib": round(torch.cuda.memory_allocated() / 2**30, 1)}  # fmt: skip
    # Which projections the split-K GEMV serves at batch <= 8 (kernels/gemv.py, chosen at
    # start-up against cuBLAS, bias included), by weight shape.
    from stator.engines.native.layers import Linear

    res["gemv_choice"] = {
        str(tuple(m.weight.shape)): str(m.gemv_config)
        for m in core.runner.model.modules()
        if isinstance(m, Linear)
    }
    rng = random.Random(1)
    for trial in range(2):
        core.add_request(request(f"d{trial}", random_ids(rng, 32), 256))
        t = drain(core)[f"d{trial}"]
    res["b1_decode_tok_s"] = round((len(t) - 1) / (t[-1] - t[0]), 1)
    packed = moe_weights == "mxfp4"
    own, mx = active_bytes(size, packed), active_bytes(size, True)
    res["floor_tok_s_own_bytes"] = round(bandwidth / own["total"], 1)
    res["floor_tok_s_mxfp4_bytes"] = round(bandwidth / mx["total"], 1)
    res["ratio_to_mxfp4_floor"] = round(res["b1_decode_tok_s"] / res["floor_tok_s_mxfp4_bytes"], 3)
    res["ratio_to_own_floor"] = round(res["b1_decode_tok_s"] / res["floor_tok_s_own_bytes"], 3)
    if args.profile:
        res["profile_b1_eager"] = profile_b1(core, rng)
    graphs = core.runner.graphs
    if graphs is not None and 1 in graphs.graphs:
        res["b1_graph_replay_ms"] = round(timed(graphs.graphs[1].replay, 50) * 1e3, 3)
    ttfts = []
    for trial in range(6):
        core.add_request(request(f"t{trial}", random_ids(rng, 2048), 1))
        start = time.perf_counter()
        drain(core)
        ttfts.append(time.perf_counter() - start)
    res["ttft_2048_ms"] = round(1e3 * statistics.median(ttfts[1:]), 1)
    steps = {}
    for bs in args.batch_sizes:
        for i in range(bs):
            core.add_request(request(f"s{bs}-{i}", random_ids(rng, 512), 40))
        while any(s.num_computed_tokens < s.num_prompt_tokens for s in core.seqs.values()):
            core.step()
        for _ in range(3):
            core.step()
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(20):
            core.step()
        steps[bs] = round(1e3 * (time.perf_counter() - start) / 20, 2)
        if args.profile and bs == max(args.batch_sizes) > 1:
            res[f"profile_b{bs}_eager"] = profile_steps(core, 5)
        drain(core)
    res["step_ms"] = steps
    del core
    gc.collect()
    torch.cuda.empty_cache()
    return res


def profile_b1(core: EngineCore, rng: random.Random) -> list:
    """CUDA time per kernel name over 8 eager batch-1 decode steps (graphs off)."""
    core.add_request(request("prof", random_ids(rng, 32), 24))
    for _ in range(8):
        core.step()
    rows = profile_steps(core, 8)
    drain(core)
    return rows


def profile_steps(core: EngineCore, n: int) -> list:
    """CUDA time per kernel name, per step, over the next n steps run eagerly (graphs off)."""
    from torch.profiler import ProfilerActivity, profile

    graphs, core.runner.graphs = core.runner.graphs, None
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(n):
            core.step()
        torch.cuda.synchronize()
    core.runner.graphs = graphs
    rows = sorted(prof.key_averages(), key=lambda e: -_device_us(e))[:25]
    return [
        {"name": e.key[:90], "calls": e.count, "us_per_step": round(_device_us(e) / n, 1)}
        for e in rows
    ]


def _device_us(event) -> float:
    return getattr(event, "device_time_total", None) or getattr(event, "cuda_time_total", 0.0)


def bench_http(args, model_dir: Path, moe_weights: str, out: Path) -> dict:
    """`stator run` on the model, then `stator bench` at concurrency 256 with the lengths of
    `--http-profile` (serving_workloads.py; made of the model's own tokens, exact lengths),
    `--http-serves` times on the same server. Also: seconds from launch to serving, the
    start-up kernel warm-up's seconds (kernel_warmup.py, from the server's log) and, after
    each serve, how many kernels the server compiled on the serving path (the warm-up
    missed them). `--fresh-triton-cache`: an empty Triton cache, as on a fresh machine."""
    from benchmarks.serving_workloads import PROFILES
    from benchmarks.stator_http import http_bench, launch

    if args.fresh_triton_cache:
        os.environ["TRITON_CACHE_DIR"] = tempfile.mkdtemp(prefix="triton-cache-")
    log = out / f"stator_run_{args.name}.log"
    start = time.perf_counter()
    proc, url = launch(
        ["--model", str(model_dir), "--load-format", "dummy", "--dtype", "bfloat16",
         "--moe-weights", moe_weights, "--max-model-len", str(args.max_model_len),
         "--max-num-seqs", "256", "--gpu-memory-utilization", str(args.gpu_memory_utilization),
         *shlex.split(args.serve_args)],
        log,
    )  # fmt: skip
    res: dict = {"profile": args.http_profile, "startup_s": round(time.perf_counter() - start, 1)}
    warm = re.search(
        r"kernel warm-up: (\d+) eager steps .* in ([\d.]+) s, (\S+) kernel", log.read_text()
    )
    if warm:
        res["warmup_steps"], res["warmup_s"], res["warmup_kernels"] = warm.groups()
    try:
        serves = []
        for i in range(args.http_serves):
            lengths = PROFILES[args.http_profile](args.http_requests)
            # Other prompts each serve: a repeat would hit the prefix cache.
            first = i * len(lengths)
            serve = http_bench(url, lengths, proc.pid, out, tokenizer=model_dir, first_id=first)
            missed = log.read_text(errors="replace").count("compiled on the serving path")
            serves.append({**serve, "serving_path_compiles_so_far": missed})
            print(json.dumps({"serve": len(serves), **serve}), flush=True)
        return {**res, **serves[0], "serves": serves}
    finally:
        proc.terminate()
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", choices=sorted(SHAPES), default="20b")
    ap.add_argument(
        "--parts",
        nargs="+",
        default=["moe", "engine"],
        choices=["moe", "gemm", "sweep", "engine", "http"],
    )
    ap.add_argument("--moe-weights", default="mxfp4", choices=["mxfp4", "bf16"])
    ap.add_argument("--tokenizer-json", type=Path)
    ap.add_argument("--http-requests", type=int, default=1000)
    ap.add_argument(
        "--http-profile",
        choices=["sharegpt", "heavy"],
        default="sharegpt",
        help="request lengths (serving_workloads.py): ShareGPT-like as the issue's vLLM number "
        "(before 2026-11-27 evening: always heavy, 600 +- 230 in / 350 +- 85 out)",
    )
    ap.add_argument("--max-model-len", type=int, default=8192)
    ap.add_argument("--gpu-memory-utilization", type=float, default=0.9)
    ap.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 16, 64, 256])
    ap.add_argument("--profile", action="store_true", help="kernel times of 8 eager b1 steps")
    ap.add_argument(
        "--expand-min-pairs",
        type=int,
        default=None,
        help="kernels/moe_dequant.MIN_PAIRS (0 = never; default: the module's): expand MXFP4 "
        "experts to bf16 from this many pairs",
    )
    ap.add_argument("--serve-args", default="", help="more `stator run` arguments (http)")
    ap.add_argument("--http-serves", type=int, default=1, help="serves on one server (http)")
    ap.add_argument(
        "--fresh-triton-cache",
        action="store_true",
        help="the server starts with an empty Triton cache, as on a fresh machine (http)",
    )
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", ".")))
    args = ap.parse_args()
    from stator.engines.native.kernels import moe_dequant

    if args.expand_min_pairs is not None:
        moe_dequant.MIN_PAIRS = args.expand_min_pairs
    mode = args.moe_weights
    res: dict = {"device": torch.cuda.get_device_name(), "model": f"gpt-oss-{args.model}",
                 "moe_weights": mode}  # fmt: skip
    args.name = f"gpt_oss_{args.model}_{mode}_{'_'.join(args.parts)}"
    if args.expand_min_pairs is not None:
        args.name += f"_expand{args.expand_min_pairs}"
    if args.serve_args:
        args.name += "_" + re.sub(r"[^A-Za-z0-9]+", "_", args.serve_args).strip("_")
    res["expand_min_pairs"] = moe_dequant.MIN_PAIRS
    bandwidth = copy_bandwidth()
    res["copy_bandwidth_gb_s"] = round(bandwidth / 1e9, 1)
    torch.cuda.empty_cache()
    experts = SHAPES[args.model]["num_local_experts"]
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = make_model_dir(Path(tmp), args.model, args.tokenizer_json)
        for part in args.parts:
            if part == "http":
                res["http"] = bench_http(args, model_dir, mode, args.out)
            elif part == "sweep":  # benchmarks/gpt_oss_sweep.py
                from benchmarks.gpt_oss_sweep import sweep

                res["sweep"] = sweep(experts)
            elif part in ("moe", "gemm"):  # gemm: the grouped GEMMs' sweep only
                res["moe_layer"] = bench_moe_layer(
                    mode == "mxfp4", experts, bandwidth, gemm_only=part == "gemm"
                )
            else:
                res["engine"] = bench_engine(args, model_dir, args.model, mode, bandwidth)
            gc.collect()
            torch.cuda.empty_cache()
            print(
                json.dumps(
                    res[{"moe": "moe_layer", "gemm": "moe_layer"}.get(part, part)], default=str
                ),
                flush=True,
            )
            save(args, res)
    print(save(args, res))


def save(args: argparse.Namespace, res: dict) -> str:
    """Write what is measured so far (a run cut short keeps its earlier parts)."""
    text = json.dumps(res, indent=2, default=str)
    (args.out / f"{args.name}.json").write_text(text)
    return text


if __name__ == "__main__":
    main()
