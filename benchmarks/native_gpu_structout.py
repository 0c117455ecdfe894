"""Structured output and speculative decoding on one GPU, with a random-weight
Llama-3.1-8B-shaped target in bf16 (`--load-format dummy`) and a 128k vocabulary shaped
like Llama-3's (`grammar_mask.py` builds it; pass its tokenizer.json, gzipped or not).

    python benchmarks/native_gpu_structout.py --tokenizer tok.json.gz [--json out.json]

1. Mask overhead: decode step time at batch 1/32/64 with every request constrained by a
   JSON schema (greedy, decode graphs and overlap on) against the same batch unconstrained;
   the host time of the mask fill (on the grammar thread) and what the step's own thread
   still waits for it are reported beside it, and the same with the fill on the step's
   path (the engine before the grammar thread).
2. Speculative decoding at controlled acceptance. Random weights make a real draft's
   acceptance meaningless, so the draft tokens come from an oracle: the target's own greedy
   continuation (recorded from a run where every draft is rejected, on the same verify
   path), each draft token kept with probability alpha and otherwise replaced by a wrong
   one. Two drafters: a free one (prompt-lookup cost: nothing on the device) and a
   2-layer 8B-wide draft model that really runs its k forward passes before the oracle
   overwrites its tokens (a small draft model's or an EAGLE head's cost). Reported: decode
   tok/s at batch 1 and 8 against the measured mean accepted length, verification steps
   replayed as CUDA graphs and run eagerly, and the plain decode baseline (decode graphs)
   of the same target.
"""

from __future__ import annotations

import argparse
import gc
import gzip
import json
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from grammar_mask import SCHEMAS
from native_gpu import LLAMA_31_8B, random_ids

from stator.engines.native.config import NativeConfig
from stator.engines.native.engine_core import EngineCore
from stator.engines.native.guided import MaskFill
from stator.engines.native.overlap import PendingStep
from stator.engines.native.request import Sequence
from stator.engines.native.spec import SpecStats
from stator.protocols import EngineRequest, GuidedDecoding, SamplingOptions, StopConditions

SMOKE_SHAPE = {  # --smoke: the same script on the CPU with a toy model, to check the code
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
}


def write_model(path: Path, tokenizer: Path, layers: int = 32, smoke: bool = False) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    config = {**LLAMA_31_8B, "num_hidden_layers": layers}
    if smoke:
        config.update(SMOKE_SHAPE, num_hidden_layers=max(1, layers // 16), eos_token_id=5)
    (path / "config.json").write_text(json.dumps(config))
    target = path / "tokenizer.json"
    if tokenizer.suffix == ".gz":
        with gzip.open(tokenizer, "rb") as src, open(target, "wb") as dst:
            shutil.copyfileobj(src, dst)
    else:
        shutil.copy(tokenizer, target)
    return path


def request(rid: str, ids: list[int], max_tokens: int, spec: GuidedDecoding | None = None):
    return EngineRequest(
        request_id=rid,
        model="m",
        token_ids=ids,
        sampling=SamplingOptions(temperature=0.0, guided_decoding=spec),
        stop=StopConditions(max_tokens=max_tokens, ignore_eos=True),
    )


def config(args: argparse.Namespace, **kw) -> NativeConfig:
    """(In the speculative runs the prefix cache is off: a prompt prefilled from cached
    blocks gives bf16-different logits, and the recorded continuation would not match.)"""
    return NativeConfig(
        device="cpu" if args.smoke else "cuda",
        dtype="float32" if args.smoke else "bfloat16",
        load_format="dummy",
        max_model_len=4096,
        max_num_seqs=max(args.batch_sizes),
        kv_cache_memory=args.kv_cache,
        **kw,
    )


def free(core: EngineCore) -> None:
    core.close()
    del core
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


# -- 1. mask overhead ----------------------------------------------------------------------


def mask_overhead(args: argparse.Namespace, model_dir: Path) -> dict:
    """Variants at each batch size: `free` (no constraint), `constrained` (the engine:
    masks filled on the grammar thread while the host prepares the next step),
    `constrained_sync` (the fill on the step's own path, as before: sampled right after
    it) and `constrained_threadsN` (the engine with an N-thread llguidance pool)."""
    core = EngineCore(config(args), model_dir)
    host = {"fill_s": 0.0, "wait_s": 0.0, "calls": 0}
    compiler = core.guidance._compiler()
    assert compiler is not None
    fill = compiler.fill

    def timed_fill(*fill_args):  # on the grammar thread
        t = time.perf_counter()
        try:
            return fill(*fill_args)
        finally:
            host["fill_s"] += time.perf_counter() - t
            host["calls"] += 1

    compiler.fill = timed_fill  # type: ignore[method-assign]
    result = MaskFill.result

    def timed_result(self):  # on the step's thread: what the fill still costs it
        t = time.perf_counter()
        try:
            return result(self)
        finally:
            host["wait_s"] += time.perf_counter() - t

    MaskFill.result = timed_result  # type: ignore[method-assign]
    guidance = core.guidance
    engine_launch = guidance.launch_sampling

    def sync_launch(sampler, logits, seqs):  # the fill on the step's path, sampled at once
        tokens = sampler.sample_tokens(logits, seqs, guidance.constraint(seqs))
        return PendingStep.launch(seqs, tokens)

    rng = random.Random(0)
    schema = SCHEMAS[args.schema][0]
    out: dict = {"schema": args.schema}
    variants = [("free", None), ("constrained", None), ("constrained_sync", None)]
    variants += [(f"constrained_threads{n}", n) for n in args.mask_threads]
    default_executor = compiler.executor
    for bs in args.batch_sizes:
        row = {}
        for name, threads in variants:
            spec = None if name == "free" else GuidedDecoding(json_schema=schema)
            if threads is not None:
                import llguidance

                compiler.executor = llguidance.LLExecutor(threads)
            guidance.launch_sampling = sync_launch if name == "constrained_sync" else engine_launch
            for i in range(bs):
                core.add_request(request(f"m{bs}{name}{i}", random_ids(rng, 256), 200, spec))
            while any(s.num_computed_tokens < s.num_prompt_tokens for s in core.seqs.values()):
                core.step()
            for _ in range(4):
                core.step()
            host.update(fill_s=0.0, wait_s=0.0, calls=0)
            sync()
            start, n = time.perf_counter(), args.steps
            for _ in range(n):
                core.step()
            sync()
            row[name + "_step_ms"] = round(1e3 * (time.perf_counter() - start) / n, 3)
            row[name + "_running"] = len(core.scheduler.running)
            if spec is not None:
                calls = max(1, host["calls"])
                row[name + "_mask_fill_ms"] = round(1e3 * host["fill_s"] / calls, 3)
                row[name + "_mask_wait_ms"] = round(1e3 * host["wait_s"] / calls, 3)
            for rid in list(core.seqs):
                core.abort(rid)
            while core.has_work():
                core.step()
            compiler.executor = default_executor
        for name, _ in variants[1:]:
            ratio = row[f"{name}_step_ms"] / row["free_step_ms"] - 1
            row[name.replace("constrained", "overhead")] = round(ratio, 4)
        out[f"batch{bs}"] = row
        print(f"mask overhead batch {bs}: {row}", flush=True)
    MaskFill.result = result  # type: ignore[method-assign]
    free(core)
    return out


# -- 2. speculative decoding ---------------------------------------------------------------


class Oracle:
    """Draft tokens = the target's recorded greedy continuation, each kept with probability
    `alpha`; `inner` (a draft model) runs first so its cost is paid."""

    def __init__(self, inner, vocab: int) -> None:
        self.inner = inner
        self.vocab = vocab
        self.alpha = 0.0
        self.reference: dict[str, list[int]] = {}
        self.rng = random.Random(0)

    def propose(self, seqs: list[Sequence], ks: list[int], starts: list[int]):
        if self.inner is not None:
            self.inner.propose(seqs, ks, starts)
        for seq, k, start in zip(seqs, ks, starts, strict=True):
            ref = self.reference.get(seq.request_id, [])
            for j in range(k):
                pos = start + j - seq.num_prompt_tokens
                good = ref[pos] if pos < len(ref) else 0
                keep = self.rng.random() < self.alpha
                seq.token_ids[start + j] = good if keep else (good + 1) % self.vocab
        return [None] * len(seqs)

    def observe(self, *args) -> None:
        if self.inner is not None:
            self.inner.observe(*args)

    def forget(self, rid: str) -> None:
        if self.inner is not None:
            self.inner.forget(rid)

    def keep_only(self, rids: set[str]) -> None:
        if self.inner is not None:
            self.inner.keep_only(rids)


def decode_rate(core: EngineCore, prompts: list[list[int]], tag: str, tokens: int) -> tuple:
    """(decode tok/s over the batch after prefill, each request's tokens)."""
    for i, ids in enumerate(prompts):
        core.add_request(request(f"{tag}{i}", ids, tokens))
    while any(s.num_computed_tokens < s.num_prompt_tokens for s in core.seqs.values()):
        core.step()
    produced: dict[str, list[int]] = {}
    for seq in core.seqs.values():
        produced[seq.request_id] = list(seq.output_ids)
    sync()
    start = time.perf_counter()
    count = 0
    while core.has_work():
        for rid, out in core.step():
            produced.setdefault(rid, []).extend(out.token_ids)
            count += len(out.token_ids)
    sync()
    return count / (time.perf_counter() - start), produced


def speculative(args: argparse.Namespace, model_dir: Path, draft_dir: Path) -> dict:
    """Each (batch, drafter, alpha) twice: verification steps replayed as CUDA graphs
    (the engine) and run eagerly (`runner.verify_graphs` off), same core, same reference;
    `matches_reference`: the fraction of requests whose greedy output equals the recorded
    continuation (speculation must not change it)."""
    rng = random.Random(1)
    prompts = {b: [random_ids(rng, 128) for _ in range(b)] for b in args.spec_batches}
    out: dict = {"k": args.k, "tokens": args.tokens}
    base = EngineCore(config(args, enable_prefix_caching=False), model_dir)
    decode_rate(base, prompts[args.spec_batches[0]], "warm", 16)
    for b in args.spec_batches:
        rate, _ = decode_rate(base, prompts[b], f"base{b}-", args.tokens)
        out[f"baseline_b{b}_tok_s"] = round(rate, 1)
        print(f"baseline batch {b}: {rate:.1f} tok/s", flush=True)
    free(base)
    spec = json.dumps(
        {"method": "draft_model", "model": str(draft_dir), "num_speculative_tokens": args.k}
    )
    core = EngineCore(config(args, speculative_config=spec, enable_prefix_caching=False), model_dir)
    assert core.specdec is not None
    graphs = core.runner.verify_graphs
    out["verify_graphs"] = graphs is not None
    draft = core.specdec.model
    oracle = Oracle(None, core.spec.vocab_size)
    core.specdec.model = oracle  # type: ignore[assignment]
    decode_rate(core, prompts[args.spec_batches[0]], "warm", 16)
    rows = []
    modes = ["graphs", "eager"] if graphs is not None else ["eager"]
    for b in args.spec_batches:
        # Record the continuation on the verify path (every draft rejected).
        oracle.alpha = 0.0
        _, produced = decode_rate(core, prompts[b], f"b{b}-", args.tokens)
        for drafter in args.drafters:
            oracle.inner = draft if drafter == "draft_2layer" else None
            for alpha in args.alphas:
                for mode in modes:
                    core.runner.verify_graphs = graphs if mode == "graphs" else None
                    tag = f"b{b}-{drafter}-{alpha}-{mode}-"
                    oracle.alpha = alpha
                    oracle.reference = {
                        rid.replace(f"b{b}-", tag): toks for rid, toks in produced.items()
                    }
                    core.specdec.stats = SpecStats()
                    rate, got = decode_rate(core, prompts[b], tag, args.tokens)
                    stats = core.specdec.stats
                    same = sum(got.get(rid) == toks for rid, toks in oracle.reference.items())
                    row = {
                        "batch": b,
                        "drafter": drafter,
                        "alpha": alpha,
                        "verify": mode,
                        "tok_s": round(rate, 1),
                        "speedup": round(rate / out[f"baseline_b{b}_tok_s"], 3),
                        "acceptance_rate": round(stats.acceptance_rate, 3),
                        "mean_accepted_length": round(stats.mean_accepted_length, 3),
                        "matches_reference": round(same / len(oracle.reference), 3),
                    }
                    rows.append(row)
                    print(f"spec: {row}", flush=True)
    core.runner.verify_graphs = graphs
    out["runs"] = rows
    free(core)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokenizer", type=Path, required=True)
    parser.add_argument("--json", help="write the results here as JSON")
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 32, 64])
    parser.add_argument("--spec-batches", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--alphas", type=float, nargs="+", default=[0.0, 0.6, 0.8, 1.0])
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument(
        "--drafters", nargs="+", default=["free", "draft_2layer"], choices=["free", "draft_2layer"]
    )
    parser.add_argument(
        "--mask-threads",
        type=int,
        nargs="*",
        default=[],
        help="also time masks filled by N threads",
    )
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--steps", type=int, default=24)
    parser.add_argument("--schema", default="nested_record", choices=sorted(SCHEMAS))
    parser.add_argument("--kv-cache", default="12GiB")
    parser.add_argument("--skip", nargs="*", default=[], choices=["mask", "spec"])
    parser.add_argument("--smoke", action="store_true", help="a toy model on the CPU")
    args = parser.parse_args()
    if args.smoke:
        args.batch_sizes, args.spec_batches, args.tokens, args.steps = [1, 4], [1, 2], 24, 3
        args.kv_cache = "256MiB"
    device = "cpu (smoke)" if args.smoke else torch.cuda.get_device_name()
    results: dict = {"device": device}
    with tempfile.TemporaryDirectory() as tmp:
        target = write_model(Path(tmp) / "target", args.tokenizer, smoke=args.smoke)
        draft = write_model(Path(tmp) / "draft", args.tokenizer, layers=2, smoke=args.smoke)
        if "mask" not in args.skip:
            results["mask_overhead"] = mask_overhead(args, target)
        if "spec" not in args.skip:
            results["speculative"] = speculative(args, target, draft)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
