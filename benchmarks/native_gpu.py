"""Native engine on one GPU: a random-weight Llama-3.1-8B-shaped model in bf16, built on the
device (`--load-format dummy`, nothing downloaded or carried), then the same workloads with
transformers on the same GPU. Prints one table at the end; `--json PATH` keeps the numbers.

    python benchmarks/native_gpu.py [--num-requests 1000] [--skip-hf] [--json out.json]

Workloads: batch-1 decode (32-token prompt, 256 tokens out); TTFT of one 1,024-token prompt
on an idle engine (median of 5, distinct prompts so the prefix cache cannot help); offline
throughput of N requests with ShareGPT-like lengths (input uniform 200-1,000, output
uniform 200-500, seed 0, all submitted at once, greedy, EOS ignored); decode step time by
batch size (prompts of 512 tokens, steps timed after every sequence is decoding) against
the weight-streaming floor at the measured copy bandwidth.
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from stator.engines.native.config import NativeConfig
from stator.engines.native.engine_core import EngineCore
from stator.protocols import EngineRequest, SamplingOptions, StopConditions

LLAMA_31_8B = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "vocab_size": 128256,
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "max_position_embeddings": 131072,
    "rms_norm_eps": 1e-5,
    "rope_theta": 500000.0,
    "rope_scaling": {
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
    },
    "tie_word_embeddings": False,
    "hidden_act": "silu",
    "torch_dtype": "bfloat16",
    "bos_token_id": 128000,
    "eos_token_id": 128001,
}


def request(rid: str, ids: list[int], max_tokens: int) -> EngineRequest:
    return EngineRequest(
        request_id=rid,
        model="m",
        token_ids=ids,
        sampling=SamplingOptions(temperature=0.0),
        stop=StopConditions(max_tokens=max_tokens, ignore_eos=True),
    )


def random_ids(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(1000, 120000) for _ in range(n)]


def sharegpt_like(n: int, seed: int = 0) -> list[tuple[list[int], int]]:
    rng = random.Random(seed)
    return [(random_ids(rng, rng.randint(200, 1000)), rng.randint(200, 500)) for _ in range(n)]


def copy_bandwidth() -> float:
    """Device-to-device copy, bytes read + written per second."""
    a = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    b = torch.empty_like(a)
    for _ in range(3):
        b.copy_(a)
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(20):
        b.copy_(a)
    torch.cuda.synchronize()
    return 2 * a.numel() * 20 / (time.perf_counter() - t)


def drain(core: EngineCore, step=None) -> dict[str, list[float]]:
    """Step until idle (with `step`, e.g. a profiler's wrapper, in place of `core.step`);
    per request the wall time of each token."""
    step = step or core.step
    times: dict[str, list[float]] = {}
    while core.has_work():
        for rid, out in step():
            if out.token_ids:
                times.setdefault(rid, []).append(time.perf_counter())
    return times


def decode_and_ttft(core: EngineCore, rng: random.Random) -> dict[str, float]:
    """Batch-1 decode tok/s (256 tokens; the second run: the first compiles and warms
    everything) and the median TTFT of a 1,024-token prompt on an idle engine."""
    for trial in range(2):
        core.add_request(request(f"d{trial}", random_ids(rng, 32), 256))
        t = drain(core)[f"d{trial}"]
    ttfts = []
    for trial in range(6):
        core.add_request(request(f"t{trial}", random_ids(rng, 1024), 1))
        start = time.perf_counter()
        drain(core)
        ttfts.append(time.perf_counter() - start)
    return {
        "b1_decode_tok_s": (len(t) - 1) / (t[-1] - t[0]),
        "ttft_1024_ms": 1e3 * statistics.median(ttfts[1:]),
    }


def start_decoding(
    core: EngineCore,
    rng: random.Random,
    tag: str,
    batch: int,
    prompt_len: int,
    max_tokens: int,
    warm_steps: int,
) -> None:
    """Add `batch` requests with random prompts, step until every prompt is prefilled, then
    take `warm_steps` decode steps, so that the next steps are pure decode of that batch."""
    for i in range(batch):
        core.add_request(request(f"{tag}-{i}", random_ids(rng, prompt_len), max_tokens))
    while any(s.num_computed_tokens < s.num_prompt_tokens for s in core.seqs.values()):
        core.step()
    for _ in range(warm_steps):
        core.step()


def bench_native(args: argparse.Namespace, model_dir: Path) -> dict:
    config = NativeConfig(
        device="cuda",
        dtype="bfloat16",
        load_format="dummy",
        max_model_len=args.max_model_len,
        max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens,
        gpu_memory_utilization=args.gpu_memory_utilization,
        enforce_eager=args.eager,
        tune_gemv=not args.no_gemv,
        overlap=args.overlap,
    )
    t0 = time.perf_counter()
    core = EngineCore(config, model_dir)
    res: dict = {"startup_s": time.perf_counter() - t0, "kv_blocks": core.blocks.num_blocks}
    res["gemv"] = {
        str(tuple(m.weight.shape)): str(m.gemv_config)
        for m in core.runner.model.modules()
        if hasattr(m, "gemv_config")
    }
    weights = [p for n, p in core.runner.model.named_parameters() if "embed_tokens" not in n]
    res["streamed_weight_bytes"] = sum(p.numel() * p.element_size() for p in weights)
    rng = random.Random(1)

    res.update(decode_and_ttft(core, rng))

    # Decode step time by batch size.
    steps, replay = {}, {}
    for bs in args.batch_sizes:
        start_decoding(core, rng, f"s{bs}", bs, prompt_len=512, max_tokens=48, warm_steps=3)
        torch.cuda.synchronize()
        start, n = time.perf_counter(), 24
        for _ in range(n):
            core.step()
        steps[bs] = 1e3 * (time.perf_counter() - start) / n
        graphs = core.runner.graphs
        if graphs is not None and (bs, False) in graphs.graphs:
            # The same step's graph alone (inputs of the last step): GPU time without the
            # engine's CPU work (scheduling, input building, sampling).
            for _ in range(3):
                graphs.graphs[bs, False].replay()
            torch.cuda.synchronize()
            start = time.perf_counter()
            for _ in range(n):
                graphs.graphs[bs, False].replay()
            torch.cuda.synchronize()
            replay[bs] = 1e3 * (time.perf_counter() - start) / n
        drain(core)
    res["step_ms"] = steps
    res["replay_ms"] = replay

    # Offline throughput.
    work = sharegpt_like(args.num_requests)
    for i, (ids, out_len) in enumerate(work):
        core.add_request(request(f"o{i}", ids, out_len))
    start = time.perf_counter()
    times = drain(core)
    elapsed = time.perf_counter() - start
    res["offline"] = {
        "requests": len(work),
        "input_tokens": sum(len(ids) for ids, _ in work),
        "output_tokens": sum(len(v) for v in times.values()),
        "seconds": elapsed,
        "output_tok_s": sum(len(v) for v in times.values()) / elapsed,
    }
    del core
    gc.collect()
    torch.cuda.empty_cache()
    return res


def bench_hf(args: argparse.Namespace) -> dict:
    import transformers

    cfg = transformers.LlamaConfig(**{k: v for k, v in LLAMA_31_8B.items() if k != "architectures"})
    with torch.device("cuda"):
        model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
    model.eval()
    res: dict = {}
    rng = random.Random(2)

    def gen(ids: torch.Tensor, new: int, **kw) -> float:
        torch.cuda.synchronize()
        t = time.perf_counter()
        model.generate(
            ids, max_new_tokens=new, min_new_tokens=new, do_sample=False, pad_token_id=0, **kw
        )
        torch.cuda.synchronize()
        return time.perf_counter() - t

    short = torch.tensor([random_ids(rng, 32)], device="cuda")
    gen(short, 8)
    res["b1_decode_tok_s"] = 255 / (gen(short, 256) - gen(short, 1))
    ttfts = [gen(torch.tensor([random_ids(rng, 1024)], device="cuda"), 1) for _ in range(4)]
    res["ttft_1024_ms"] = 1e3 * statistics.median(ttfts[1:])

    # Static batch: left-padded prompts, generate up to the longest output, count only
    # the tokens each request asked for.
    work = sharegpt_like(args.num_requests)[: args.hf_batch]
    width = max(len(ids) for ids, _ in work)
    ids = torch.zeros(len(work), width, dtype=torch.long, device="cuda")
    mask = torch.zeros_like(ids)
    for i, (p, _) in enumerate(work):
        ids[i, width - len(p) :] = torch.tensor(p)
        mask[i, width - len(p) :] = 1
    longest = max(n for _, n in work)
    secs = gen(ids, longest, attention_mask=mask)
    useful = sum(n for _, n in work)
    res["static_batch"] = {"requests": len(work), "seconds": secs, "output_tok_s": useful / secs}

    if hasattr(model, "generate_batch"):
        try:
            gcfg = transformers.GenerationConfig(
                max_new_tokens=max(n for _, n in work), do_sample=False, eos_token_id=-1
            )
            start = time.perf_counter()
            outs = model.generate_batch(inputs=[p for p, _ in work], generation_config=gcfg)
            secs = time.perf_counter() - start
            produced = sum(len(o.generated_tokens) for o in outs.values())
            res["continuous_batching"] = {
                "requests": len(work),
                "seconds": secs,
                "output_tok_s": produced / secs,
            }
        except Exception as exc:  # report it in the table instead of losing the run
            res["continuous_batching"] = {"error": f"{type(exc).__name__}: {exc}"[:200]}
    return res


def print_table(res: dict) -> None:
    n, h = res["native"], res.get("hf", {})
    bw = res["copy_bandwidth"]
    floor_ms = 1e3 * n["streamed_weight_bytes"] / bw

    def ratio(a: float | None, b: float | None) -> str:
        return f"{a / b:.2f}x" if a and b else "-"

    print(f"\ndevice: {res['device']}; copy bandwidth {bw / 1e12:.2f} TB/s; ")
    print(f"weights streamed per step {n['streamed_weight_bytes'] / 1e9:.2f} GB")
    print("| metric | native | transformers | native / transformers |")
    print("|---|---|---|---|")
    print(
        f"| batch-1 decode tok/s | {n['b1_decode_tok_s']:.1f} | "
        f"{h.get('b1_decode_tok_s', 0):.1f} | {ratio(n['b1_decode_tok_s'], h.get('b1_decode_tok_s'))} |"
    )
    hb = h.get("ttft_1024_ms")
    print(
        f"| TTFT 1,024 tokens ms | {n['ttft_1024_ms']:.1f} | {hb or 0:.1f} | "
        f"{ratio(hb, n['ttft_1024_ms'])} faster |"
    )
    off = n["offline"]
    for key in ("static_batch", "continuous_batching"):
        other = h.get(key, {})
        label = f"{other.get('requests', '?')} req, {key.replace('_', ' ')}"
        if "error" in other:
            print(
                f"| offline output tok/s | {off['output_tok_s']:.0f} | {label}: {other['error']} | - |"
            )
        elif other:
            print(
                f"| offline output tok/s | {off['output_tok_s']:.0f} ({off['requests']} req) | "
                f"{other['output_tok_s']:.0f} ({label}) | "
                f"{ratio(off['output_tok_s'], other['output_tok_s'])} |"
            )
    print(
        f"\noffline: {off['requests']} requests, {off['input_tokens']} in / "
        f"{off['output_tokens']} out tokens, {off['seconds']:.1f} s"
    )
    print(
        "\n| batch | step ms | tok/s | graph replay ms | floor ms (weights / copy BW) "
        "| step / floor |"
    )
    print("|---|---|---|---|---|---|")
    for bs, ms in n["step_ms"].items():
        rep = n["replay_ms"].get(bs)
        rep_s = f"{rep:.2f}" if rep else "-"
        print(
            f"| {bs} | {ms:.2f} | {bs * 1e3 / ms:.0f} | {rep_s} | {floor_ms:.2f} "
            f"| {ms / floor_ms:.2f} |"
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--num-requests", type=int, default=1000)
    ap.add_argument("--hf-batch", type=int, default=64, help="requests in transformers' batch")
    ap.add_argument("--max-model-len", type=int, default=4096)
    ap.add_argument("--max-num-seqs", type=int, default=256)
    ap.add_argument("--max-num-batched-tokens", type=int, default=8192)
    ap.add_argument("--gpu-memory-utilization", type=float, default=0.9)
    ap.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8, 32, 64, 128, 256])
    ap.add_argument("--eager", action="store_true", help="no CUDA graphs")
    ap.add_argument("--no-gemv", action="store_true", help="cuBLAS for every matmul")
    ap.add_argument(
        "--overlap", choices=["auto", "on", "off"], default="auto", help="see --overlap"
    )
    ap.add_argument("--skip-hf", action="store_true")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    res = {"device": torch.cuda.get_device_name(), "copy_bandwidth": copy_bandwidth()}
    res["args"] = vars(args) | {"json": str(args.json)}
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = Path(tmp)
        (model_dir / "config.json").write_text(json.dumps(LLAMA_31_8B))
        res["native"] = bench_native(args, model_dir)
    print(json.dumps(res["native"], indent=1), flush=True)
    if not args.skip_hf:
        res["hf"] = bench_hf(args)
    if args.json:
        args.json.write_text(json.dumps(res, indent=1))
    print_table(res)


if __name__ == "__main__":
    main()
