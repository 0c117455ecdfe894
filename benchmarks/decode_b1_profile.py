"""Batch-1 decode with fused GEMV epilogues on and off, in one process (issue #17).

An 8B-shaped Llama in bf16 with random weights and the bundled 4k vocabulary (as
`native_gpu_http_vs_engine.py`'s engine part) in one `EngineCore`. For each round of
`--modes` it sets `epilogues.ENABLED` ("fused" in the mode's name) and `pdl.ENABLED`
("pdl"), captures the decode graphs again (same weights, same GEMV configs: those of the
fused epilogues serve only with "fused") and measures: batch-1 decode tok/s (a
32-token prompt, 256 output tokens, from the tokens' arrival times: the whole step,
host included), the kernels of one batch-1 step (count, GPU time by kernel, the GPU's busy
fraction; torch.profiler over 32 steps; with PDL the kernels' spans overlap, so read
the span per step, not the summed kernel time) and the decode step at batch 256 (contexts
~600 tokens). It prints one JSON line per round and each mode's medians and their ratios
to "off".

    python benchmarks/decode_b1_profile.py [--modes off fused fused+pdl pdl] [--out DIR]
    python benchmarks/decode_b1_profile.py --device cpu --tiny   (a smoke run; no profile)
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from native_gpu import drain, request  # noqa: E402
from native_gpu_serve import make_8b_dir  # noqa: E402
from stator_http import BUNDLED  # noqa: E402
from step_profile import kernel_profile  # noqa: E402


def gemv_sweep(shapes: dict) -> dict:
    """Per projection shape (one row): cuBLAS and every GEMV candidate, with its split sum
    (as unfused layers run it) and without (as a fused epilogue leaves it), in TB/s."""
    return {name: _sweep_one(weight) for name, weight in shapes.items()}


def _sweep_one(weight) -> dict:
    import torch

    from stator.engines.native.kernels import gemv

    n, k = weight.shape
    x = torch.randn(1, k, device=weight.device, dtype=weight.dtype)
    tb = weight.numel() * weight.element_size() / 1e9  # GB, per ms: TB/s
    row = {"cublas": tb / gemv._graph_time(lambda: torch.nn.functional.linear(x, weight))}
    sms = torch.cuda.get_device_properties(weight.device).multi_processor_count
    for cfg in gemv.candidates(n, k, sms):
        tag = f"{cfg.block_n}x{cfg.block_k}/s{cfg.split_k}/w{cfg.num_warps}"
        for reduce in (True, False) if cfg.split_k > 1 else (True,):
            ms = gemv._graph_time(
                lambda cfg=cfg, reduce=reduce: gemv.gemv(x, weight, cfg, reduce=reduce)
            )
            row[tag + ("" if reduce else "/parts")] = tb / ms
    best = sorted(row.items(), key=lambda kv: -kv[1])[:8]
    return {
        "shape": [n, k],
        "cublas_tb_s": round(row["cublas"], 3),
        "best_tb_s": {t: round(v, 3) for t, v in best},
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--tiny", action="store_true", help="the bundled tiny model (smoke run)")
    ap.add_argument(
        "--modes", nargs="+", default=["off", "fused", "fused+pdl", "off", "fused", "fused+pdl"]
    )
    ap.add_argument("--b1-tokens", type=int, default=256)
    ap.add_argument("--out", default="")
    ap.add_argument("--sweep", action="store_true", help="time every GEMV config per shape")
    args = ap.parse_args()

    import torch

    from stator.engines.native import epilogues, step_graphs
    from stator.engines.native.config import NativeConfig
    from stator.engines.native.engine_core import EngineCore
    from stator.engines.native.kernels import pdl
    from stator.protocols import EngineRequest

    cuda = args.device == "cuda"
    mdir = BUNDLED if args.tiny else make_8b_dir(Path(tempfile.mkdtemp()))
    config = NativeConfig(
        device=args.device,
        dtype="bfloat16" if cuda else "float32",
        load_format="auto" if args.tiny else "dummy",
        max_num_seqs=256,
        cudagraph_mode="full_decode_only",  # mixed-step pieces are not measured here
    )
    core = EngineCore(config, mdir)
    runner = core.runner
    vocab = core.spec.vocab_size
    rng = random.Random(7)
    layer0 = runner.model.model.layers[0]
    gemv = {
        name: [repr(getattr(mod, "gemv_config", None)), repr(getattr(mod, "epilogue_gemv", None))]
        for name, mod in (
            ("qkv", layer0.self_attn.qkv_proj),
            ("o", layer0.self_attn.o_proj),
            ("gate_up", layer0.mlp.gate_up_proj),
            ("down", layer0.mlp.down_proj),
            ("lm_head", runner.model.lm_head),
        )
    }
    print("GEMV (unfused, fused epilogue) " + json.dumps(gemv), flush=True)
    if args.sweep and cuda:
        shapes = {
            "qkv": layer0.self_attn.qkv_proj.weight,
            "o": layer0.self_attn.o_proj.weight,
            "gate_up": layer0.mlp.gate_up_proj.weight,
            "down": layer0.mlp.down_proj.weight,
        }
        print("SWEEP " + json.dumps(gemv_sweep(shapes)), flush=True)

    def req(rid: str, isl: int, osl: int) -> EngineRequest:
        return request(rid, [rng.randrange(10, vocab) for _ in range(isl)], osl)

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize()

    rounds = []
    for i, mode in enumerate(args.modes):
        epilogues.ENABLED = "fused" in mode
        pdl.ENABLED = "pdl" in mode
        step_graphs.release(runner)
        step_graphs.capture(runner, prepare=False)
        res: dict = {"round": i, "mode": mode}
        tok_s = []
        for trial in range(2):  # the first also warms
            core.add_request(req(f"b1-{i}-{trial}", 32, args.b1_tokens))
            t = drain(core)[f"b1-{i}-{trial}"]
            tok_s.append((len(t) - 1) / (t[-1] - t[0]))
        res["b1_tok_s"] = tok_s[-1]
        res["b1_tok_s_first"] = tok_s[0]
        if cuda:
            core.add_request(req(f"k-{i}", 32, 48))
            for _ in range(4):
                core.step()
            res["b1_kernels"] = kernel_profile(lambda: [core.step() for _ in range(32)], 32)
            drain(core)
        isl = 40 if args.tiny else 600
        for j in range(256):
            core.add_request(req(f"s{i}-{j}", isl, 40))
        while any(s.num_computed_tokens < s.num_prompt_tokens for s in core.seqs.values()):
            core.step()
        for _ in range(3):
            core.step()
        sync()
        start, n = time.perf_counter(), 20
        for _ in range(n):
            core.step()
        sync()
        res["step_ms_at_256"] = 1e3 * (time.perf_counter() - start) / n
        drain(core)
        print("ROUND " + json.dumps(res), flush=True)
        rounds.append(res)

    summary: dict = {"gemv": gemv}
    modes = list(dict.fromkeys(args.modes))
    for mode in modes:
        mine = [r for r in rounds if r["mode"] == mode]
        summary[mode] = {
            key: statistics.median(r[key] for r in mine) for key in ("b1_tok_s", "step_ms_at_256")
        }
        if cuda:
            for key in ("kernels_per_step", "span_ms_per_step", "busy"):
                summary[mode][key] = statistics.median(r["b1_kernels"][key] for r in mine)
    if "off" in summary:
        for mode in modes:
            base, this = summary["off"], summary[mode]
            this["b1_tok_s_over_off"] = this["b1_tok_s"] / base["b1_tok_s"]
            this["step_256_over_off"] = this["step_ms_at_256"] / base["step_ms_at_256"]
    print("SUMMARY " + json.dumps(summary), flush=True)
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        (Path(args.out) / "decode_b1_profile.json").write_text(
            json.dumps({"rounds": rounds, "summary": summary}, indent=1)
        )


if __name__ == "__main__":
    main()
