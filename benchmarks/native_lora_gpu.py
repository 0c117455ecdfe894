"""LoRA overhead and sleep/wake times of the native engine on one GPU, on a random-weight
Llama-3.1-8B-shaped model in bf16 (`--load-format dummy`: nothing downloaded).

    python benchmarks/native_lora_gpu.py [--json out.json]

- Throughput: `--concurrency` requests (prompt `--prompt-len` random ids, `--output-len`
  tokens, greedy, EOS ignored) submitted at once; output tok/s from the first step to the
  last token. Base: the engine without LoRA. LoRA: the engine with `--enable-lora`, the
  requests spread round-robin over `--adapters` different rank-`--rank` adapters on every
  projection (q, k, v, o, gate, up, down). Each run is done twice; the second counts.
- Batch-1 decode: one request (32-token prompt, 256 out), with and without an adapter.
- Sleep/wake (levels 1 and 2) of the base engine: seconds, device memory in use before,
  during and after (torch's allocated and reserved, and nvidia-smi's used), and whether
  greedy outputs after waking equal those before.
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.native_gpu import LLAMA_31_8B, drain, random_ids, request
from stator.engines.native.config import NativeConfig
from stator.engines.native.engine_core import EngineCore
from stator.engines.native.lora.adapter import load_adapter, pin_adapter
from tests.engines.native.lora_adapters import write_random_adapter


def smi_used_mib() -> float:
    out = subprocess.run(
        ["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
        capture_output=True,
        text=True,
        check=False,
    )
    try:
        return float(out.stdout.strip().splitlines()[0])
    except (IndexError, ValueError):
        return float("nan")


def memory() -> dict[str, float]:
    torch.cuda.synchronize()
    return {
        "allocated_mib": torch.cuda.memory_allocated() / 2**20,
        "reserved_mib": torch.cuda.memory_reserved() / 2**20,
        "smi_used_mib": smi_used_mib(),
    }


def throughput(core: EngineCore, args, loras: list[str | None], tag: str) -> float:
    rng = random.Random(0)
    for i in range(args.concurrency):
        req = request(f"{tag}{i}", random_ids(rng, args.prompt_len), args.output_len)
        req.lora_name = loras[i % len(loras)]
        core.add_request(req)
    start = time.perf_counter()
    times = drain(core)
    end = max(t[-1] for t in times.values())
    return sum(len(t) for t in times.values()) / (end - start)


def batch1(core: EngineCore, lora: str | None, tag: str) -> float:
    rng = random.Random(1)
    req = request(tag, random_ids(rng, 32), 256)
    req.lora_name = lora
    core.add_request(req)
    t = drain(core)[tag]
    return (len(t) - 1) / (t[-1] - t[0])


def greedy(core: EngineCore, tag: str) -> list[int]:
    core.add_request(request(tag, random_ids(random.Random(2), 64), 32))
    out: list[int] = []
    while core.has_work():
        for _rid, o in core.step():
            out.extend(o.token_ids)
    return out


def make_core(model_dir: Path, args, **extra) -> EngineCore:
    config = NativeConfig(
        load_format="dummy",
        max_num_seqs=max(64, args.concurrency),
        max_model_len=4096,
        **extra,
    )
    return EngineCore(config, model_dir)


def lora_core(model_dir: Path, paths: list[Path], args, **extra) -> EngineCore:
    core = make_core(
        model_dir, args, enable_lora=True, max_loras=args.adapters, max_lora_rank=args.rank, **extra
    )
    for i, path in enumerate(paths):
        adapter = load_adapter(f"lora{i}", path, core.runner.model, args.rank, core.runner.dtype)
        pin_adapter(adapter)
        core.add_adapter(adapter)
    return core


def interleaved(model_dir: Path, paths: list[Path], args, res: dict, save) -> None:
    base = make_core(model_dir, args, kv_cache_memory="8GiB")
    lora = lora_core(model_dir, paths, args, kv_cache_memory="8GiB")
    names = [f"lora{i}" for i in range(args.adapters)]
    throughput(base, args, [None], "bw")
    throughput(lora, args, names, "lw")
    runs: dict[str, list[float]] = {"base": [], "lora": [], "lora_engine_base": []}
    b1: dict[str, list[float]] = {"base": [], "lora": []}
    for r in range(args.interleave):
        runs["base"].append(throughput(base, args, [None], f"b{r}-"))
        runs["lora"].append(throughput(lora, args, names, f"l{r}-"))
        runs["lora_engine_base"].append(throughput(lora, args, [None], f"lb{r}-"))
        b1["base"].append(batch1(base, None, f"b1{r}"))
        b1["lora"].append(batch1(lora, "lora0", f"l1{r}"))
        res["interleaved_tok_s"], res["interleaved_b1_tok_s"] = runs, b1
        save()
    med = {k: statistics.median(v) for k, v in runs.items()}
    med_b1 = {k: statistics.median(v) for k, v in b1.items()}
    res["median_tok_s"], res["median_b1_tok_s"] = med, med_b1
    res["lora_vs_base"] = med["lora"] / med["base"]
    res["lora_vs_lora_engine_base"] = med["lora"] / med["lora_engine_base"]
    res["lora_b1_vs_base"] = med_b1["lora"] / med_b1["base"]
    save()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--adapters", type=int, default=8)
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--prompt-len", type=int, default=128)
    parser.add_argument("--output-len", type=int, default=256)
    parser.add_argument(
        "--interleave",
        type=int,
        default=0,
        help="Build both engines (8 GiB of KV each) and alternate base and LoRA runs this "
        "many times (medians reported; GPU clocks and host noise hit both alike)",
    )
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    res: dict = {"device": torch.cuda.get_device_name(), "args": vars(args) | {"json": None}}

    def save() -> None:
        print(json.dumps(res, indent=1), flush=True)
        if args.json:
            args.json.write_text(json.dumps(res, indent=1))

    with tempfile.TemporaryDirectory() as tmp:
        model_dir = Path(tmp) / "llama8b"
        model_dir.mkdir()
        (model_dir / "config.json").write_text(json.dumps(LLAMA_31_8B))
        started = time.perf_counter()
        paths = [
            write_random_adapter(Path(tmp) / f"lora{i}", LLAMA_31_8B, rank=args.rank, seed=i)
            for i in range(args.adapters)
        ]
        res["adapters_written_s"] = time.perf_counter() - started

        if args.interleave:
            interleaved(model_dir, paths, args, res, save)
            return

        # -- base engine: throughput, batch-1, then sleep/wake ---------------------------
        core = make_core(model_dir, args, enable_sleep_mode=True)
        throughput(core, args, [None], "w")
        res["base_tok_s"] = throughput(core, args, [None], "b")
        batch1(core, None, "b1w")
        res["base_b1_tok_s"] = batch1(core, None, "b1")
        save()
        before = greedy(core, "g0")
        res["awake"] = memory()
        for level in (1, 2):
            t = time.perf_counter()
            core.sleep(level)
            torch.cuda.synchronize()
            res[f"sleep{level}_s"] = time.perf_counter() - t
            res[f"asleep{level}"] = memory()
            t = time.perf_counter()
            core.wake()
            torch.cuda.synchronize()
            res[f"wake{level}_s"] = time.perf_counter() - t
            res[f"same_outputs_after_wake{level}"] = greedy(core, f"g{level}") == before
            awake = res["awake"]
            res[f"asleep{level}_fraction"] = {
                "torch_allocated": res[f"asleep{level}"]["allocated_mib"] / awake["allocated_mib"],
                "smi_used": res[f"asleep{level}"]["smi_used_mib"] / awake["smi_used_mib"],
            }
            save()
        core.close()
        del core
        gc.collect()
        torch.cuda.empty_cache()

        # -- LoRA engine -----------------------------------------------------------------
        started = time.perf_counter()
        core = lora_core(model_dir, paths, args)
        res["lora_engine_built_s"] = time.perf_counter() - started
        names = [f"lora{i}" for i in range(args.adapters)]
        throughput(core, args, names, "lw")
        res["lora_tok_s"] = throughput(core, args, names, "l")
        res["lora_enabled_base_requests_tok_s"] = throughput(core, args, [None], "lb")
        batch1(core, "lora0", "l1w")
        res["lora_b1_tok_s"] = batch1(core, "lora0", "l1")
        res["lora_vs_base"] = res["lora_tok_s"] / res["base_tok_s"]
        res["lora_b1_vs_base"] = res["lora_b1_tok_s"] / res["base_b1_tok_s"]
        save()


if __name__ == "__main__":
    main()
