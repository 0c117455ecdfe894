"""GPT-OSS-20B batch-1 decode on one GPU, this session's changes on and off in one process
(issue 16): the row-tile streaming MoE kernels (`kernels/moe_stream.py`) against
moe_gemv's own, and the fused GEMV epilogues of the GPT-OSS layers (`epilogues.py`).

Random weights in the real MXFP4 layout (`gpt_oss_gpu.make_model_dir`, nothing
downloaded). Parts, in this order, each printing one JSON line as it ends:

- `moe`: the expert kernels of one layer at batch 1 as CUDA graphs: the MoE with the old
  and the new kernels, then the new up and down kernels alone per tile, against the time
  their MXFP4 bytes take at the copy bandwidth;
- `engine`: one `EngineCore`; for each of `--modes` (names joined by "+": "epi" fused
  epilogues, "stream" the new MoE kernels, "pdl" programmatic dependent launch; "old" none)
  the decode graphs are captured again and it measures batch-1 decode tok/s (a 32-token
  prompt, 256 tokens; the host included), the kernels of one batch-1 step from the graph
  (count, GPU time by kernel, span) and, with `--b256`, the decode step at batch 256.

    python benchmarks/gpt_oss_b1.py [--parts moe engine] [--modes epi+stream old ...]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402

from benchmarks.gpt_oss_gpu import active_bytes, make_model_dir  # noqa: E402
from benchmarks.gpt_oss_moe_layer import graph_timed  # noqa: E402
from benchmarks.native_gpu import copy_bandwidth, drain, request  # noqa: E402

MXFP4 = 17 / 32  # bytes a value, scales included
LAYERS = 3
# Swept 2026-11-28 (H100): up (2, 16, 4) best of (2|4|1, 8, 4), (4|8, 4, 4), (4, 8, 8); down
# (2, 16, 4) best of (4|2|8, 8, 4), (4, 4, 4), (1, 16, 4), (8, 4, 8). More groups a step won:
# these go on from there.
UP_TILES = [(2, 16, 4), (1, 32, 4), (2, 32, 4), (4, 16, 4), (1, 16, 4), (2, 16, 8), (4, 32, 8)]
DOWN_TILES = [(2, 16, 4), (1, 32, 4), (2, 32, 4), (4, 16, 4), (1, 16, 4), (2, 16, 8), (4, 32, 8)]


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def random_ids(rng: random.Random, n: int, vocab: int) -> list[int]:
    return [rng.randrange(10, vocab) for _ in range(n)]


def emit(out: Path, name: str, res) -> None:
    print(json.dumps({name: res}, default=str), flush=True)
    (out / f"b1_{name}.json").write_text(json.dumps(res, indent=1, default=str))


@torch.inference_mode()
def bench_moe(bandwidth: float) -> dict:
    """Times per layer over LAYERS distinct layers' weights in one graph (one layer's
    ~53 MB would stay partly in the 50 MB L2 between replays)."""
    from stator.engines.native.kernels import moe_gemv as mg
    from stator.engines.native.kernels import moe_stream as ms
    from stator.engines.native.kernels.fused_moe import fused_moe
    from tests.engines.native.test_gpu_gpt_oss import _moe

    mods = [_moe(True) for _ in range(LAYERS)]
    moe = mods[0]
    x = torch.randn(1, 2880, device="cuda", dtype=torch.bfloat16)
    weights, ids = moe.route(x)
    ref = moe._reference(x, weights, ids).float()
    res: dict = {"layers": LAYERS}

    def per_layer(fn) -> float:
        return graph_timed(lambda: [fn(m) for m in mods], 100) * 1e6 / LAYERS

    def layer(enabled: bool, pdl: bool = True) -> float:
        ms.ENABLED, ms.DOWN_PDL = enabled, pdl
        y = fused_moe(x, weights, ids, moe).float()
        err = float((y - ref).norm() / ref.norm())
        assert err < 2e-2, (enabled, pdl, err)
        return round(per_layer(lambda m: fused_moe(x, weights, ids, m)), 2)

    variants = {"new": (True, True), "new_no_pdl": (True, False)}
    for rnd in range(2):
        res[f"old_us_{rnd}"] = layer(False)
        for name, flags in variants.items():
            res[f"{name}_us_{rnd}"] = layer(*flags)
    best = min(variants, key=lambda v: res[f"{v}_us_0"] + res[f"{v}_us_1"])
    _, ms.DOWN_PDL = variants[best]
    ms.ENABLED = True
    res["best_variant"] = best
    print(json.dumps({"moe_layer": res}), flush=True)
    up_s = 4 * 5760 * 2880 * MXFP4 / bandwidth * 1e6
    down_s = 4 * 2880 * 2880 * MXFP4 / bandwidth * 1e6
    res["floor_us"] = {"up": round(up_s, 2), "down": round(down_s, 2)}
    pairs, inv = mg.half_pairs(x)
    flat = ids.reshape(-1).contiguous()
    shift = mg.h_shift(moe.alpha, moe.limit)
    act = torch.empty(4, moe.inter, dtype=torch.float16, device="cuda")
    out = torch.empty(1, 2880, dtype=torch.bfloat16, device="cuda")
    route_w = weights.reshape(-1).contiguous()
    saved = ms.UP_CONFIG, ms.DOWN_CONFIG
    for kind, tiles, floor in (("up", UP_TILES, up_s), ("down", DOWN_TILES, down_s)):
        times = {}
        for tile in tiles:
            try:
                if kind == "up":
                    ms.UP_CONFIG = tile
                    us = per_layer(lambda m: ms.up(pairs, inv, flat, m, act, shift, True))
                else:
                    ms.DOWN_CONFIG = tile
                    us = per_layer(lambda m: ms.down(act, flat, route_w, m, out, shift, True))
                times[str(tile)] = {"us": round(us, 2), "of_copy": round(floor / us, 3)}
            except Exception as exc:  # a tile that does not compile or fit: skip it
                times[str(tile)] = f"failed: {type(exc).__name__}: {str(exc)[:160]}"
        res[kind] = times
        ok = {t: v["us"] for t, v in times.items() if isinstance(v, dict)}
        res[f"best_{kind}"] = min(ok, key=ok.get) if ok else None
    ms.UP_CONFIG, ms.DOWN_CONFIG = saved
    res["default_tiles_us"] = layer(True, ms.DOWN_PDL)
    if res["best_up"] and res["best_down"]:  # the layer with the best tiles (checked)
        ms.UP_CONFIG = tuple(int(v) for v in res["best_up"].strip("()").split(","))
        ms.DOWN_CONFIG = tuple(int(v) for v in res["best_down"].strip("()").split(","))
        res["best_tiles_us"] = layer(True, ms.DOWN_PDL)
        if res["best_tiles_us"] > res["default_tiles_us"]:
            ms.UP_CONFIG, ms.DOWN_CONFIG = saved
    res["installed"] = {"up": ms.UP_CONFIG, "down": ms.DOWN_CONFIG, "down_pdl": ms.DOWN_PDL}
    mods.clear()  # their memory back before the engine
    return res


def set_mode(mode: str) -> None:
    from stator.engines.native import epilogues
    from stator.engines.native.kernels import moe_stream, pdl

    parts = set(mode.split("+"))
    unknown = parts - {"epi", "stream", "pdl", "old"}
    if unknown:
        raise SystemExit(f"unknown mode parts {sorted(unknown)}")
    epilogues.ENABLED = "epi" in parts
    moe_stream.ENABLED = "stream" in parts
    pdl.ENABLED = "pdl" in parts


def capture(core, max_batch: int) -> None:
    from stator.engines.native import step_graphs

    step_graphs.release(core.runner)
    torch.cuda.empty_cache()
    core.runner.graphs = step_graphs._decode_graphs(core.runner, max_batch, 1)
    core.runner.graphs.capture()


def b256_step(core, rng: random.Random, tag: str, batch: int, vocab: int) -> float:
    for i in range(batch):
        core.add_request(
            request(f"s{tag}-{i}", random_ids(rng, 512 if batch == 256 else 16, vocab), 40)
        )
    while any(s.num_computed_tokens < s.num_prompt_tokens for s in core.seqs.values()):
        core.step()
    for _ in range(3):
        core.step()
    sync()
    start = time.perf_counter()
    for _ in range(20):
        core.step()
    sync()
    ms = 1e3 * (time.perf_counter() - start) / 20
    drain(core)
    return ms


def bench_engine(args, out: Path, bandwidth: float) -> None:
    from step_profile import kernel_profile

    from stator.engines.native.config import NativeConfig
    from stator.engines.native.engine_core import EngineCore
    from stator.engines.native.layers import Linear

    cuda = args.smoke_model is None
    if cuda:
        model_dir = make_model_dir(Path(tempfile.mkdtemp()), "20b", None)  # kept: the engine's
        config = NativeConfig(
            device="cuda", dtype="bfloat16", load_format="dummy", moe_weights="mxfp4",
            max_model_len=4096, max_num_seqs=256, max_num_batched_tokens=8192,
            gpu_memory_utilization=0.85, cudagraph_mode="full_decode_only",
            max_graph_batch=args.graph_batch,
        )  # fmt: skip
    else:  # a smoke run of this script on the CPU (a tiny checkpoint, no graphs)
        model_dir = args.smoke_model
        config = NativeConfig(device="cpu", dtype="float32", kv_cache_memory="64MiB")
    t0 = time.perf_counter()
    core = EngineCore(config, model_dir)
    vocab = core.spec.vocab_size
    floor = bandwidth / active_bytes("20b", True)["total"]
    layer0 = core.runner.model.model.layers[0]
    gemv = {
        name: [repr(mod.gemv_config), repr(mod.epilogue_gemv)]
        for name, mod in (
            ("qkv", layer0.self_attn.qkv_proj),
            ("o", layer0.self_attn.o_proj),
            ("router", layer0.mlp.router),
            ("lm_head", core.runner.model.lm_head),
        )
        if isinstance(mod, Linear)
    }
    emit(out, "engine_start", {"startup_s": round(time.perf_counter() - t0, 1),
                               "floor_tok_s": round(floor, 1), "gemv": gemv})  # fmt: skip
    rng = random.Random(1)
    rounds = []
    tokens = 256 if cuda else 8
    for i, mode in enumerate(args.modes):
        set_mode(mode)
        if cuda:
            capture(core, args.graph_batch)
        res: dict = {"round": i, "mode": mode}
        tok_s = []
        for trial in range(2):  # the first also warms
            core.add_request(request(f"b1-{i}-{trial}", random_ids(rng, 32, vocab), tokens))
            t = drain(core)[f"b1-{i}-{trial}"]
            tok_s.append((len(t) - 1) / (t[-1] - t[0]))
        res["b1_tok_s"] = round(tok_s[-1], 1)
        res["b1_tok_s_first"] = round(tok_s[0], 1)
        res["of_floor"] = round(tok_s[-1] / floor, 3)
        if args.profile and cuda:
            core.add_request(request(f"k-{i}", random_ids(rng, 32, vocab), 48))
            for _ in range(4):
                core.step()
            prof = kernel_profile(lambda: [core.step() for _ in range(32)], 32)
            drain(core)
            top = sorted(prof["by_kernel"].items(), key=lambda kv: -kv[1]["ms"])[:22]
            res["b1_kernels"] = {k: prof[k] for k in ("kernels_per_step", "span_ms_per_step",
                                                      "gpu_ms_per_step", "busy")}  # fmt: skip
            res["b1_by_kernel_us"] = {k[:70]: [v["n"], round(v["ms"] * 1e3, 1)] for k, v in top}
        print("ROUND " + json.dumps(res), flush=True)
        rounds.append(res)
        (out / "b1_rounds.json").write_text(json.dumps(rounds, indent=1))
    summary = {}
    for mode in dict.fromkeys(args.modes):
        mine = [r["b1_tok_s"] for r in rounds if r["mode"] == mode]
        summary[mode] = {"b1_tok_s_median": statistics.median(mine), "rounds": mine}
    base = args.modes[-1] if "old" not in summary else "old"
    for row in summary.values():
        row[f"over_{base}"] = round(row["b1_tok_s_median"] / summary[base]["b1_tok_s_median"], 3)
        row["of_floor"] = round(row["b1_tok_s_median"] / floor, 3)
    emit(out, "engine_summary", summary)
    if args.b256:
        steps = {}
        for mode in args.b256:
            set_mode(mode)
            if cuda:
                capture(core, 256)
            steps[mode] = round(b256_step(core, rng, mode, 256 if cuda else 4, vocab), 2)
            print("B256 " + json.dumps({mode: steps[mode]}), flush=True)
        emit(out, "b256_step_ms", steps)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--parts", nargs="+", default=["moe", "engine"], choices=["moe", "engine"])
    ap.add_argument(
        "--modes", nargs="+", default=["epi+stream", "old", "epi+stream", "old", "epi", "stream"]
    )
    ap.add_argument("--b256", nargs="*", default=[], help="modes whose batch-256 step is timed")
    ap.add_argument("--graph-batch", type=int, default=8, help="decode graphs up to this batch")
    ap.add_argument("--profile", action="store_true", help="kernels of one batch-1 step")
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", ".")))
    ap.add_argument("--smoke-model", type=Path, help="a tiny GPT-OSS checkpoint: CPU smoke run")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    if args.smoke_model is not None:
        bench_engine(args, args.out, 1e12)
        return
    bandwidth = copy_bandwidth()
    emit(args.out, "device", {"name": torch.cuda.get_device_name(),
                              "copy_tb_s": round(bandwidth / 1e12, 3)})  # fmt: skip
    if "moe" in args.parts:
        emit(args.out, "moe", bench_moe(bandwidth))
        torch.cuda.empty_cache()
    if "engine" in args.parts:
        bench_engine(args, args.out, bandwidth)


if __name__ == "__main__":
    main()
