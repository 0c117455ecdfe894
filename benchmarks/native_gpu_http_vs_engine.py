"""The engine alone and the server through HTTP, on the same workload, in one call.

An 8B-shaped Llama in bf16 with random weights (`--load-format dummy`; the bundled
tokenizer, so the vocabulary is 4,096 and the LM head smaller than Llama-3's) serves two
length profiles of N requests each:

- heavy: input 600 ± 200, output 350 ± 87 tokens (normal, clipped);
- sharegpt: long-tailed like ShareGPT (log-normal; means 221 in, 219 out).

For each profile it measures (1) the engine alone: an `EngineCore` in a process of its own,
every request added at once, stepped until done; (2) each server variant (`stator run`
with its flags) through HTTP with `stator bench`'s load generator at concurrency 256,
completions endpoint, exact lengths (ignore_eos), the same lengths as (1). It prints both,
the busiest server process's CPU, and the workload's floor: prefill FLOPs at the measured
bf16 matmul rate plus decode bytes (weights once per step, KV read per token) at the
measured copy bandwidth, with as many steps as the batch cap or the longest output needs
(`serving_workloads.floor` says why), and each result's ratio to it and to the old floor
(steps from the batch cap alone, the ratio the README's history used). Also: batch-1
decode tok/s, the decode step at batch 256, and mixed steps in isolation (16 / 64 / 240
decodes plus one new 128-token prompt each step) with the GPU's busy fraction over them.
`--engine-variant NAME=JSON` times the engine alone again with other `NativeConfig` fields
(e.g. eager mixed steps: `{"cudagraph_mode": "full_decode_only"}`; admission order:
`lof={"scheduling_policy": "lof"}` with `--skip-variant-mixed`); its "_bench" key holds
what is not a config field: {"env": {...}} for the engine's process, {"unfreeze_gc": true}
(the collector as before `EngineCore` froze its start-up heap). Each run of the engine
alone also prints its per-step ledger (`step_ledger.py`) and saves its rows under --out.

    python benchmarks/native_gpu_http_vs_engine.py [--num-requests 1000] \\
        [--variant "default=" --variant "api2=--api-server-count 2"] \\
        [--engine-variant 'eager_mixed={"cudagraph_mode": "full_decode_only"}']
    python benchmarks/native_gpu_http_vs_engine.py --http-profiles sharegpt \\
        --engine-variant 'lof={"scheduling_policy": "lof"}' --skip-variant-mixed \\
        --variant "default=" --variant "lof=--scheduling-policy lof"
    python benchmarks/native_gpu_http_vs_engine.py --device cpu --tiny --num-requests 16
"""

from __future__ import annotations

import argparse
import gc
import itertools
import json
import os
import random
import re
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from http_vs_engine_table import print_table  # noqa: E402
from native_gpu import drain, request  # noqa: E402
from native_gpu_serve import make_8b_dir  # noqa: E402
from serving_workloads import PROFILES, device_rates, floor  # noqa: E402
from stator_http import BUNDLED, CONCURRENCY, http_bench, start_server  # noqa: E402
from step_ledger import format_ledger, ledger  # noqa: E402
from step_profile import (  # noqa: E402
    StepProfile,
    busiest_threads,
    gpu_busy,
    host_profile,
    thread_cpu,
)


def workload(args: argparse.Namespace, profile: str) -> list[tuple[int, int]]:
    """The profile's lengths; an eighth of them with --tiny (a 1,024-token model)."""
    lengths = PROFILES[profile](args.num_requests)
    if args.tiny:
        return [(max(4, i // 8), max(2, o // 8)) for i, o in lengths]
    return lengths


def model_dir(root: Path, tiny: bool) -> Path:
    return BUNDLED if tiny else make_8b_dir(root)


def model_config(mdir: Path) -> dict:
    """The model's config.json with the fields the floor reads filled in."""
    cfg = json.loads((mdir / "config.json").read_text())
    cfg.setdefault("head_dim", cfg["hidden_size"] // cfg["num_attention_heads"])
    cfg.setdefault("num_key_value_heads", cfg["num_attention_heads"])
    return cfg


# -- the engine alone (a subprocess: its GPU memory is gone before a server starts) --------


def engine_alone_main(args: argparse.Namespace) -> None:
    import torch

    from stator.engines.native.config import NativeConfig
    from stator.engines.native.engine_core import EngineCore
    from stator.protocols import EngineRequest

    root = Path(tempfile.mkdtemp())
    mdir = model_dir(root, args.tiny)
    fields = {
        "device": args.device,
        "dtype": "bfloat16" if args.device == "cuda" else "float32",
        "load_format": "auto" if args.tiny else "dummy",
        "max_num_seqs": CONCURRENCY,
    }
    config = NativeConfig(**{**fields, **json.loads(args.engine_config)})
    core = EngineCore(config, mdir)
    if args.unfreeze_gc:  # as before the engine froze its start-up heap (an A/B baseline)
        gc.unfreeze()
    vocab = core.spec.vocab_size
    rng = random.Random(7)

    def req(rid: str, isl: int, osl: int) -> EngineRequest:
        return request(rid, [rng.randrange(10, vocab) for _ in range(isl)], osl)

    steps = StepProfile(core)

    def closed_loop(reqs: list[EngineRequest]) -> dict[str, list[float]]:
        times: dict[str, list[float]] = {}
        todo = iter(reqs[CONCURRENCY:])
        for r in reqs[:CONCURRENCY]:
            core.add_request(r)
        while core.has_work():
            for rid, out in core.step():
                if out.token_ids:
                    times.setdefault(rid, []).append(time.perf_counter())
                if out.finish_reason is not None:
                    nxt = next(todo, None)
                    if nxt is not None:
                        core.add_request(nxt)
        return times

    def timed(run) -> dict:
        threads = thread_cpu()
        start, c0 = time.perf_counter(), time.process_time()
        times = run()
        secs = time.perf_counter() - start
        produced = sum(len(v) for v in times.values())
        return {
            "seconds": secs,
            "output_tokens": produced,
            "output_tok_s": produced / secs,
            "cpu_pct": 100 * (time.process_time() - c0) / secs,
            "threads_cpu_pct": busiest_threads(threads, thread_cpu(), secs),
        }

    cfg = model_config(mdir)
    rates = json.loads(args.rates) if args.rates else None

    def profiled_run(name: str, label: str = "") -> dict:
        """Every request of the profile added at once, stepped until done, step by step;
        with the parent's device rates, the run's ledger (`step_ledger`), its rows saved
        as ledger_<label>.json under --out."""
        lengths = workload(args, name)
        for i, (isl, osl) in enumerate(lengths):
            core.add_request(req(f"{name}-{label}-{i}", isl, osl))
        steps.reset()
        out = timed(lambda: drain(core, steps.step))
        steps.device_times()
        out["steps"] = steps.summary()
        if rates is not None:
            led = ledger(steps.records, cfg, rates, floor(lengths, cfg, rates, CONCURRENCY))
            out["ledger"] = {"classes": led["classes"], "totals": led["totals"]}
            print(f"LEDGER {label or name}\n{format_ledger(led)}", flush=True)
            path = Path(args.out) / f"ledger_{label or name}.json"
            path.write_text(json.dumps(led["rows"]))
        run = {k: out[k] for k in ("seconds", "output_tokens", "output_tok_s")}
        print(f"RUN {label or name} {json.dumps(run)}", flush=True)  # before a cut
        return out

    ids = itertools.count()

    def mixed_steps(
        decodes: int, prompt_len: int, n: int, profile: bool = False, host: bool = False
    ) -> dict:
        """Mean step with `decodes` sequences decoding and one new `prompt_len`-token prompt
        entering each step (it ends there: max_tokens 1): the launch-bound mixed step.
        `profile`: also the GPU's busy fraction over the timed steps (`gpu_busy`); `host`:
        where the host's time goes over them (`host_profile`)."""
        for _ in range(decodes):
            core.add_request(req(f"m{next(ids)}", 64, 10 * n))
        while any(s.num_computed_tokens < s.num_prompt_tokens for s in core.seqs.values()):
            core.step()

        def run(steps: int) -> None:
            for _ in range(steps):
                core.add_request(req(f"p{next(ids)}", prompt_len, 1))
                core.step()

        run(3)
        if args.device == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        run(n)
        out: dict = {"ms": 1e3 * (time.perf_counter() - start) / n}
        if profile:
            try:
                out.update(gpu_busy(lambda: run(n)))
            except Exception as exc:  # the profiler's API moves between torch versions
                out["error"] = repr(exc)
        if host:
            try:
                out["host"] = host_profile(lambda: run(n))
            except Exception as exc:
                out["host_error"] = repr(exc)
        drain(core)
        return out

    res: dict = {}
    mixed_steps(16, 128, 5)  # warm-up: the first steps of a shape compile kernels
    for decodes in () if args.no_mixed else (16, 64, 240):  # 240 + 1: under the batch cap
        r = mixed_steps(decodes, 128, 30, profile=args.device == "cuda")
        res[f"mixed_step_ms_{decodes}_plus_128"] = r.pop("ms")
        res[f"gpu_busy_{decodes}_plus_128"] = r
    if args.device == "cuda" and not args.no_mixed:
        # Mixed steps at the batch cap (496 and 840 tokens: pieces by default, eager with
        # full_decode_only or a lower --piecewise-max-tokens), and where the host's time
        # goes in each.
        for decodes, prompt_len in ((240, 256), (240, 600)):
            r = mixed_steps(decodes, prompt_len, 12, profile=True, host=True)
            res[f"mixed_step_ms_{decodes}_plus_{prompt_len}"] = r.pop("ms")
            res[f"gpu_busy_{decodes}_plus_{prompt_len}"] = r
    if args.device == "cuda" and args.long_mixed:
        # Past the old 1,024-token limit: the same step as pieces and eagerly, one engine.
        pieces = core.runner.piecewise
        if pieces is not None:
            res["piecewise"] = {
                "max_tokens": pieces.max_tokens,
                "buckets": len(pieces.buckets),
                "capture_s": round(pieces.capture_s, 2),
                "pool_mib": round(pieces.pool_bytes / 2**20),
                "buffer_mib": round(pieces.buffer_bytes() / 2**20),
                "kv_blocks": core.runner.num_blocks,
            }
        for prompt_len in (1400, 1800):
            for mode in ("pieces", "eager") if pieces is not None else ("eager",):
                core.runner.piecewise = pieces if mode == "pieces" else None
                r = mixed_steps(240, prompt_len, 12, profile=True)
                res[f"mixed_step_ms_240_plus_{prompt_len}_{mode}"] = r.pop("ms")
                res[f"gpu_busy_240_plus_{prompt_len}_{mode}"] = r
        core.runner.piecewise = pieces
    print("MIXED " + json.dumps(res), flush=True)
    for policy in args.policies or [config.scheduling_policy]:
        # One engine, each admission order in turn (the scheduler reads it every step).
        core.scheduler.policy = policy
        for name in args.profiles if args.profiles_only else ():
            key = name if not args.policies else f"{name}_{policy}"
            res[key] = profiled_run(name, f"{args.label}{key}")
    if args.profiles_only:
        print("ENGINE-ALONE " + json.dumps(res), flush=True)
        return
    for trial in range(2):  # the second: the first compiles and warms
        core.add_request(req(f"b1-{trial}", 32, 256))
        t = drain(core)[f"b1-{trial}"]
    res["b1_decode_tok_s"] = (len(t) - 1) / (t[-1] - t[0])
    if args.device == "cuda":  # the kernels of 64 batch-1 decode steps
        core.add_request(req("b1-kernels", 32, 70))
        for _ in range(4):
            core.step()
        res["b1_kernels"] = gpu_busy(lambda: [core.step() for _ in range(64)])
        drain(core)
    # The decode step at the batch cap, contexts ~ the heavy profile's prompts.
    for i in range(CONCURRENCY):
        core.add_request(req(f"s{i}", 600, 40))
    while any(s.num_computed_tokens < s.num_prompt_tokens for s in core.seqs.values()):
        core.step()
    for _ in range(3):
        core.step()
    if args.device == "cuda":
        torch.cuda.synchronize()
    start, n = time.perf_counter(), 20
    for _ in range(n):
        core.step()
    res["step_ms_at_256"] = 1e3 * (time.perf_counter() - start) / n
    if args.device == "cuda":
        res["step_256_kernels"] = gpu_busy(lambda: [core.step() for _ in range(8)])
    drain(core)
    for name in args.profiles:
        lengths = workload(args, name)
        res[name] = profiled_run(name, f"{args.label}{name}")
        if not args.closed_loop:
            continue
        # The same requests, at most CONCURRENCY in the engine at once (as the HTTP load
        # generator sends them), so the two differ only by the process boundary and HTTP.
        reqs = [req(f"{name}-c{i}", isl, osl) for i, (isl, osl) in enumerate(lengths)]
        res[f"{name}_closed_loop"] = timed(lambda reqs=reqs: closed_loop(reqs))
    print("ENGINE-ALONE " + json.dumps(res), flush=True)


def engine_alone(
    args: argparse.Namespace,
    log: Path,
    config: str = "{}",
    profiles_only: bool = False,
    profiles: list[str] | None = None,
    rates: dict | None = None,
    label: str = "",
    env: dict | None = None,
    unfreeze_gc: bool = False,
) -> dict:
    cmd = [sys.executable, __file__, "--engine-alone", "--device", args.device]
    cmd += ["--out", args.out, "--label", label]
    cmd += ["--rates", json.dumps(rates)] if rates else []
    cmd += ["--policies", *args.policies] if profiles_only and args.policies else []
    cmd += ["--num-requests", str(args.num_requests), "--profiles", *(profiles or args.profiles)]
    cmd += ["--tiny"] if args.tiny else []
    cmd += ["--closed-loop"] if args.closed_loop else []
    cmd += ["--engine-config", config] + (["--profiles-only"] if profiles_only else [])
    cmd += ["--no-mixed"] if profiles_only and args.skip_variant_mixed else []
    cmd += ["--long-mixed"] if args.long_mixed else []
    with log.open("wb") as handle:
        subprocess.run(
            cmd + (["--unfreeze-gc"] if unfreeze_gc else []),
            stdout=handle,
            stderr=subprocess.STDOUT,
            check=False,
            cwd=REPO,
            env={**os.environ, **(env or {})},
        )
    text = log.read_text(errors="replace")
    m = re.search(r"^ENGINE-ALONE (.*)$", text, re.M)
    if not m:
        raise RuntimeError(f"the engine-alone run failed:\n{text[-3000:]}")
    return json.loads(m.group(1))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--tiny", action="store_true", help="the bundled model (CPU smoke test)")
    ap.add_argument("--num-requests", type=int, default=1000)
    ap.add_argument("--profiles", nargs="+", default=list(PROFILES), choices=list(PROFILES))
    ap.add_argument(
        "--variant",
        action="append",
        default=[],
        help="NAME=FLAGS for `stator run` (repeatable; default: one variant, its defaults)",
    )
    ap.add_argument("--skip-engine", action="store_true")
    ap.add_argument(
        "--closed-loop",
        action="store_true",
        help=f"also time the engine alone with at most {CONCURRENCY} requests in it at once",
    )
    ap.add_argument(
        "--engine-variant",
        action="append",
        default=[],
        help="NAME=JSON: also time the engine alone with these NativeConfig fields (e.g. "
        'eager_mixed={"cudagraph_mode": "full_decode_only"}), both profiles, all at once',
    )
    ap.add_argument(
        "--engine-profiles",
        nargs="+",
        choices=list(PROFILES),
        help="the profiles the engine alone and its variants run (default: --profiles)",
    )
    ap.add_argument(
        "--skip-variant-mixed",
        action="store_true",
        help="engine variants time only the profiles, not the mixed steps (e.g. admission "
        "order variants: the steps are the same)",
    )
    ap.add_argument(
        "--http-profiles",
        nargs="+",
        choices=list(PROFILES),
        help="the profiles each HTTP variant serves (default: --profiles)",
    )
    ap.add_argument("--skip-http", action="store_true", help="the engine alone only")
    ap.add_argument(
        "--policies",
        nargs="+",
        choices=("fcfs", "lof"),
        help="engine variants run each profile under each admission order in turn, one "
        "engine (results '<profile>_<policy>'; default: the variant's own policy, once)",
    )
    ap.add_argument(
        "--long-mixed",
        action="store_true",
        help="each engine also times mixed steps of 240 decodes + a 1,400 / 1,800-token "
        "prompt as piecewise graphs and eagerly",
    )
    ap.add_argument("--engine-alone", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--rates", default="", help=argparse.SUPPRESS)
    ap.add_argument("--unfreeze-gc", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--label", default="", help=argparse.SUPPRESS)
    ap.add_argument("--engine-config", default="{}", help=argparse.SUPPRESS)
    ap.add_argument("--profiles-only", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--no-mixed", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    args = ap.parse_args()
    if args.engine_alone:
        engine_alone_main(args)
        return
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    variants = [v.partition("=")[::2] for v in args.variant] or [("default", "")]
    res: dict = {"rates": device_rates(args.device), "http": {}}
    tmp = Path(tempfile.mkdtemp())
    mdir = model_dir(tmp, args.tiny)
    cfg = model_config(mdir)
    res["floor"] = {
        name: floor(workload(args, name), cfg, res["rates"], CONCURRENCY) for name in args.profiles
    }
    if not args.skip_engine:
        res["engine"] = engine_alone(
            args, out / "engine_alone.log", profiles=args.engine_profiles, rates=res["rates"]
        )
        print("engine alone:", json.dumps(res["engine"]), flush=True)
    for name, config in (v.partition("=")[::2] for v in args.engine_variant):
        log = out / f"engine_alone_{name}.log"
        fields = json.loads(config or "{}")
        bench = fields.pop("_bench", {})
        r = engine_alone(
            args,
            log,
            json.dumps(fields),
            True,
            args.engine_profiles,
            res["rates"],
            label=f"{name}_",
            env=bench.get("env", {}),
            unfreeze_gc=bench.get("unfreeze_gc", False),
        )
        res.setdefault("engine_variants", {})[name] = r
        print(f"engine alone {name}:", json.dumps(r), flush=True)
        (out / "http_vs_engine.json").write_text(json.dumps(res, indent=1))
    for name, flags in [] if args.skip_http else variants:
        extra = shlex.split(flags)
        proc, url = start_server(args.device, args.tiny, mdir, extra, out / f"server_{name}.log")
        try:
            for profile in args.http_profiles or args.profiles:
                r = http_bench(url, workload(args, profile), proc.pid, tmp)
                res["http"].setdefault(name, {})[profile] = r
                print(f"http {name} {profile}:", json.dumps(r), flush=True)
                (out / "http_vs_engine.json").write_text(json.dumps(res, indent=1))
        finally:
            proc.terminate()
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
    (out / "http_vs_engine.json").write_text(json.dumps(res, indent=1))
    print_table(res, args.profiles, [n for n, _ in variants], CONCURRENCY)


if __name__ == "__main__":
    main()
