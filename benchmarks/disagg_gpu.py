"""Disaggregated serving on two GPUs of one host (the lent 2×H200), in one run:

1. the link: one `copy_` of a large tensor between the GPUs (GB/s), both ways;
2. `copy_blocks` between pools on the two GPUs in this process, 8B-shaped (32 layers, 8 KV
   heads, dim 128, bf16, 16-token blocks = 2 MiB a block), for 1k/8k/32k-token prompts with
   consecutive, churned (runs of 1-8) and scattered block ids, each copy method (`--copies`);
3. the native engine: a prefill worker process on GPU 0 and a decode worker process on
   GPU 1 (8B-shaped, random weights), prompts of 1k/8k/32k tokens through HTTP; the decode
   worker's metrics give each pull's bytes and time (CUDA IPC: the decode GPU reads the
   prefill pool across NVLink); one such fleet per `--engine-copies` method and
   `--engine-variants` entry (decode worker flags: e.g. pulls coalesced or not), all
   started at once and measured one after the other; then bursts of prompts sent at once
   (8 × 1k, 3 × 8k: their pulls overlap on the decode side), `--reps` times each;
4. TTFT / ITL through HTTP of 1P+1D against two aggregated workers (one per GPU) on the
   same mixed workload: streams with short prompts decoding while 8k-token prompts arrive.

    python benchmarks/disagg_gpu.py --out results.json       # on the device
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import re
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.native_gpu_serve import make_8b_dir  # noqa: E402
from stator.kv.block_copy import pool_shape  # noqa: E402
from stator.kv.transfer import copy as kv_copy  # noqa: E402
from stator.kv.transfer.copy import copy_blocks  # noqa: E402
from stator.kv.transfer.stats import WINDOW_GAP_S  # noqa: E402

LAYERS, HEADS, DIM, BS = 32, 8, 128, 16
SIZES = [1024, 8192, 32768]
VOCAB = 4096  # the bundled tokenizer's


def log(*parts) -> None:
    print(time.strftime("%H:%M:%S"), *parts, flush=True)


def timed(fn, reps: int = 5) -> float:
    """Best of `reps` seconds (after one warm-up), synchronizing every device."""
    fn()
    for d in range(torch.cuda.device_count()):
        torch.cuda.synchronize(d)
    best = float("inf")
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        for d in range(torch.cuda.device_count()):
            torch.cuda.synchronize(d)
        best = min(best, time.perf_counter() - t)
    return best


def link_bandwidth(nbytes: int = 4 << 30) -> dict:
    a = torch.empty(nbytes, dtype=torch.uint8, device="cuda:0")
    b = torch.empty(nbytes, dtype=torch.uint8, device="cuda:1")
    out = {
        "0->1": nbytes / timed(lambda: b.copy_(a)) / 1e9,
        "1->0": nbytes / timed(lambda: a.copy_(b)) / 1e9,
    }
    return out


def churned_ids(rng: random.Random, n: int, blocks: int) -> list[int]:
    """Ids a cache that has served a while hands out: runs of 1-8 consecutive blocks."""
    runs, start = [], 0
    while start < blocks:
        length = min(rng.randint(1, 8), blocks - start)
        runs.append(range(start, start + length))
        start += length
    rng.shuffle(runs)
    return [b for r in runs for b in r][:n]


def block_copy_bandwidth(methods: list[str]) -> dict:
    """`copy_blocks` from a pool on GPU 0 to one on GPU 1, each method, three id patterns:
    consecutive on both sides, churned (short runs), scattered (random ids)."""
    blocks = SIZES[-1] // BS * 2
    src = torch.randn(
        pool_shape(LAYERS, blocks, BS, HEADS, DIM), dtype=torch.bfloat16, device="cuda:0"
    )
    dst = torch.zeros(
        pool_shape(LAYERS, blocks, BS, HEADS, DIM), dtype=torch.bfloat16, device="cuda:1"
    )
    rng = random.Random(0)
    out = {}
    for tokens in SIZES:
        n = tokens // BS
        patterns = {
            "consecutive": (list(range(n)), list(range(n))),
            "churned": (churned_ids(rng, n, blocks), churned_ids(rng, n, blocks)),
            "scattered": (rng.sample(range(blocks), n), rng.sample(range(blocks), n)),
        }
        for name, (remote, local) in patterns.items():
            for method in methods:
                try:
                    with torch.cuda.device(1):
                        nbytes = copy_blocks(src, dst, remote, local, method)
                        seconds = timed(
                            lambda r=remote, lo=local, m=method: copy_blocks(src, dst, r, lo, m)
                        )
                    dst[:, :, local] = 0
                    with torch.cuda.device(1):
                        copy_blocks(src, dst, remote, local, method)
                    torch.cuda.synchronize(1)
                except Exception as exc:
                    out[f"{tokens}/{name}/{method}"] = {"error": f"{type(exc).__name__}: {exc}"}
                    log(f"copy_blocks {tokens} {name} {method} failed: {exc}")
                    continue
                ok = torch.equal(dst[:, :, local], src[:, :, remote].to("cuda:1"))
                out[f"{tokens}/{name}/{method}"] = {
                    "GBps": nbytes / seconds / 1e9, "ms": seconds * 1e3, "ok": ok,
                }  # fmt: skip
                log(
                    f"copy_blocks {tokens} {name} {method}: {nbytes / seconds / 1e9:.1f} GB/s ok={ok}"
                )
    return out


class Proc:
    def __init__(self, name: str, args: list[str], workdir: Path, env: dict | None = None):
        self.name = name
        self.log_path = workdir / f"{name}.log"
        handle = self.log_path.open("wb")
        full_env = dict(os.environ, PYTHONUNBUFFERED="1", **(env or {}))
        full_env["PYTHONPATH"] = f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "stator", *args], cwd=REPO, env=full_env,
            stdout=handle, stderr=subprocess.STDOUT,
        )  # fmt: skip

    def output(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Fleet:
    def __init__(self, workdir: Path, model_dir: Path, namespace: str, worker_flags: list[str]):
        self.workdir = workdir
        self.model_dir = model_dir
        self.namespace = namespace
        self.worker_flags = worker_flags
        self.discovery = f"file:{workdir / 'discovery'}"
        self.procs: list[Proc] = []
        self.ports: dict[str, int] = {}
        self.url = ""

    def common(self) -> list[str]:
        return [
            "--discovery",
            self.discovery,
            "--event-plane",
            "zmq",
            "--namespace",
            self.namespace,
        ]

    def frontend(self, *flags: str) -> None:
        port = free_port()
        self.url = f"http://127.0.0.1:{port}"
        self.procs.append(Proc(
            f"{self.namespace}-frontend", ["frontend", *self.common(), "--http-port", str(port),
            "--router-mode", "kv", *flags], self.workdir,
        ))  # fmt: skip

    def worker(self, name: str, gpus: str, *flags: str) -> None:
        port = free_port()
        self.ports[name] = port
        self.procs.append(Proc(
            f"{self.namespace}-{name}",
            ["worker", "--engine", "native", "--model", str(self.model_dir),
             "--served-model-name", "m", "--system-port", str(port), *self.common(),
             *self.worker_flags, *flags],
            self.workdir, env={"CUDA_VISIBLE_DEVICES": gpus},
        ))  # fmt: skip

    def metrics(self, name: str) -> dict[str, float]:
        text = httpx.get(f"http://127.0.0.1:{self.ports[name]}/metrics", timeout=10).text
        out = {}
        for m in re.finditer(r"^(stator_worker_engine_\w+)(?:\{[^}]*\})? (\S+)$", text, re.M):
            out[m.group(1).removeprefix("stator_worker_engine_")] = float(m.group(2))
        return out

    def wait_ready(self, decode: int, prefill: int, timeout: float = 240) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for p in self.procs:
                if p.proc.poll() is not None:
                    raise RuntimeError(f"{p.name} exited:\n{p.output()[-4000:]}")
            try:
                health = httpx.get(f"{self.url}/health", timeout=5).json()
                live = len(health.get("instances", {}).get("m", []))
                text = httpx.get(f"{self.url}/metrics", timeout=5).text
                m = re.search(r'^stator_router_prefill_workers\{model="m"\} (\S+)$', text, re.M)
                pre = int(float(m.group(1))) if m else 0
                if live >= decode and pre >= prefill:
                    return
            except (httpx.HTTPError, ValueError):
                pass
            time.sleep(1)
        raise RuntimeError("fleet not ready:\n" + "\n".join(p.output()[-2000:] for p in self.procs))

    def stop(self) -> None:
        for p in self.procs:
            p.stop()


def parse_variants(text: str) -> dict[str, list[str]]:
    """`name=flags,name=flags` -> {name: flags}; empty: one unnamed variant."""
    out: dict[str, list[str]] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        name, _, flags = item.partition("=")
        out[name.strip()] = shlex.split(flags)
    return out or {"": []}


def tokens(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(100, VOCAB - 100) for _ in range(n)]


def complete(url: str, prompt: list[int], max_tokens: int) -> dict:
    body = {"model": "m", "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
            "ignore_eos": True}  # fmt: skip
    resp = httpx.post(f"{url}/v1/completions", json=body, timeout=120)
    resp.raise_for_status()
    return resp.json()


def engine_transfers(fleet: Fleet, rng: random.Random, reps: int) -> dict:
    complete(fleet.url, tokens(rng, SIZES[0]), 2)  # warm-up: opens the IPC handle
    out = {}
    for n in SIZES:
        rows = []
        for _ in range(reps):
            before = fleet.metrics("decode")
            t = time.perf_counter()
            complete(fleet.url, tokens(rng, n), 2)
            wall = time.perf_counter() - t
            after = fleet.metrics("decode")
            nbytes = after["kv_transfer_bytes_total"] - before["kv_transfer_bytes_total"]
            secs = after["kv_transfer_seconds_total"] - before["kv_transfer_seconds_total"]
            copy = after.get("kv_transfer_copy_seconds_total", 0) - before.get(
                "kv_transfer_copy_seconds_total", 0
            )
            rows.append({
                "bytes": nbytes, "pull_ms": secs * 1e3, "copy_ms": copy * 1e3,
                "pull_GBps": nbytes / secs / 1e9 if secs else 0.0,
                "copy_GBps": nbytes / copy / 1e9 if copy else 0.0, "request_s": wall,
                # where the pull's time went (PullResult.phases)
                **{f"{p}_ms": (after.get(f"kv_transfer_{p}_seconds_total", 0)
                               - before.get(f"kv_transfer_{p}_seconds_total", 0)) * 1e3
                   for p in ("hop", "launch", "device", "hop_back", "wait", "check_wait")},
            })  # fmt: skip
        best = max(rows, key=lambda r: r["pull_GBps"])
        out[str(n)] = {"best": best, "runs": rows}
        log(f"engine transfer {n} tokens: {best}")
    for n, count in ((SIZES[0], 8), (SIZES[1], 3)):
        runs = [burst_transfers(fleet, rng, n, count) for _ in range(reps)]
        ranked = sorted(runs, key=lambda r: r["busy_GBps"])
        out[f"burst_{count}x{n}"] = {
            "best": ranked[-1], "median": ranked[len(ranked) // 2], "runs": runs,
        }  # fmt: skip
        log(f"engine burst {count} x {n} tokens: {out[f'burst_{count}x{n}']['median']}")
    out["kinds"] = {
        k: v for k, v in fleet.metrics("decode").items() if k.startswith("kv_transfers_")
    }
    out["fallbacks"] = fleet.metrics("decode").get("kv_transfer_fallbacks_total", 0)
    out["copy_kernel_failed"] = [
        line for p in fleet.procs for line in p.output().splitlines() if "kernel failed" in line
    ]
    return out


def burst_transfers(fleet: Fleet, rng: random.Random, n: int, count: int) -> dict:
    """`count` prompts of `n` tokens sent at once (prefilled together, so their pulls
    overlap on the decode side): bytes over the time with any pull in flight (`busy`), and
    over the burst's span, first pull start to last pull end, gaps included (`span`)."""
    prompts = [tokens(rng, n) for _ in range(count)]
    time.sleep(WINDOW_GAP_S + 0.1)  # the burst's first pull opens a new window
    before = fleet.metrics("decode")
    with ThreadPoolExecutor(count) as pool:
        list(pool.map(lambda p: complete(fleet.url, p, 2), prompts))
    after = fleet.metrics("decode")

    def delta(name: str) -> float:
        return after.get(name, 0.0) - before.get(name, 0.0)

    pulls, nbytes = delta("kv_transfers_total"), delta("kv_transfer_bytes_total")
    busy, total = delta("kv_transfer_busy_seconds_total"), delta("kv_transfer_seconds_total")
    batches = delta("kv_transfer_copy_batches_total")
    start, end = after["kv_transfer_window_start_time"], after["kv_transfer_last_end_time"]
    # The window opened in this burst only if it began after the last pull before it.
    span = end - start if start > before["kv_transfer_last_end_time"] else 0.0
    return {
        "span_ms": span * 1e3, "span_GBps": nbytes / span / 1e9 if span else 0.0,
        "copy_batches": batches, "pulls_per_batch": pulls / batches if batches else 0.0,
        "pulls": pulls, "bytes": nbytes, "busy_ms": busy * 1e3, "sum_pull_ms": total * 1e3,
        "mean_pull_ms": total / pulls * 1e3 if pulls else 0.0,
        "busy_GBps": nbytes / busy / 1e9 if busy else 0.0,
        "overlap": total / busy if busy else 0.0,
        # Where a pull of the burst spent its time, mean per pull (a coalesced pull counts
        # its batch's launch, device and wait times; copy: from submitting to the copy's end).
        **{f"mean_{p}_ms": delta(f"kv_transfer_{p}_seconds_total") / pulls * 1e3 if pulls else 0.0
           for p in ("copy", "launch", "device", "wait", "check_wait")},
    }  # fmt: skip


async def mixed_workload(url: str, args, seed: int) -> dict:
    """`args.streams` closed-loop clients with short prompts decode all along; a client
    with 8k-token prompts sends one every `args.long_every` seconds."""
    rng = random.Random(seed)
    records: list[dict] = []
    stop_at = time.monotonic() + args.duration

    async def stream(client: httpx.AsyncClient, prompt: list[int], osl: int, long: bool) -> None:
        body = {"model": "m", "prompt": prompt, "max_tokens": osl, "temperature": 0,
                "ignore_eos": True, "stream": True}  # fmt: skip
        start = time.perf_counter()
        times = []
        async with client.stream("POST", f"{url}/v1/completions", json=body) as resp:
            async for line in resp.aiter_lines():
                if line.startswith("data: {"):
                    times.append(time.perf_counter())
        records.append({"long": long, "start": start, "times": times})

    async def short_client(client) -> None:
        while time.monotonic() < stop_at:
            await stream(client, tokens(rng, args.short_isl), args.short_osl, False)

    async def long_client(client) -> None:
        await asyncio.sleep(args.long_every / 2)
        tasks = []
        while time.monotonic() < stop_at:
            tasks.append(
                asyncio.ensure_future(stream(client, tokens(rng, args.long_isl), 32, True))
            )
            await asyncio.sleep(args.long_every)
        await asyncio.gather(*tasks)

    limits = httpx.Limits(max_connections=args.streams + 16)
    async with httpx.AsyncClient(timeout=300, limits=limits) as client:
        await asyncio.gather(
            *(short_client(client) for _ in range(args.streams)), long_client(client)
        )
    return summarize(records)


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q / 100 * len(values)))] if values else float("nan")


def summarize(records: list[dict]) -> dict:
    out = {}
    for name, sel in (("all", records), ("short", [r for r in records if not r["long"]]),
                      ("long", [r for r in records if r["long"]])):  # fmt: skip
        sel = [r for r in sel if r["times"]]
        ttft = [(r["times"][0] - r["start"]) * 1e3 for r in sel]
        itl = [(b - a) * 1e3 for r in sel for a, b in zip(r["times"], r["times"][1:], strict=False)]
        out[name] = {
            "requests": len(sel),
            "ttft_p50_ms": pct(ttft, 50), "ttft_p99_ms": pct(ttft, 99),
            "itl_p50_ms": pct(itl, 50), "itl_p99_ms": pct(itl, 99),
        }  # fmt: skip
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, default=Path("disagg_gpu.json"))
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--streams", type=int, default=16)
    ap.add_argument("--short-isl", type=int, default=256)
    ap.add_argument("--short-osl", type=int, default=128)
    ap.add_argument("--long-isl", type=int, default=8192)
    ap.add_argument("--long-every", type=float, default=1.0)
    ap.add_argument("--duration", type=float, default=30.0)
    ap.add_argument("--kv-cache-memory", default="12GiB")
    ap.add_argument(
        "--max-batch", type=int, default=64, help="workers' max-num-seqs and graph batch"
    )
    ap.add_argument(
        "--copies", default="runs,push,pull",
        help="copy_blocks methods to time in one process",
    )  # fmt: skip
    ap.add_argument(
        "--engine-copies", default="auto",
        help="--kv-transfer-copy of the decode worker: one 1P+1D fleet each (pulls only)",
    )  # fmt: skip
    ap.add_argument(
        "--engine-variants", default="",
        help="name=decode worker flags, comma-separated: one fleet each (empty: one fleet)",
    )  # fmt: skip
    ap.add_argument("--smoke", action="store_true", help="CPU check of the harness: tiny model")
    ap.add_argument("--skip-http", action="store_true", help="transfers only: no aggregated fleet")
    args = ap.parse_args()
    res: dict = {}
    workdir = Path(tempfile.mkdtemp(prefix="disagg-gpu-"))
    if args.smoke:
        global SIZES
        SIZES = [64, 256, 512]
        model_dir = REPO / "stator" / "models" / "tiny-chat"
        flags = ["--device", "cpu", "--kv-cache-memory", "64MiB", "--health-check-interval", "0"]
        res["device"] = "cpu (smoke)"
    else:
        res |= {"device": torch.cuda.get_device_name(0), "gpus": torch.cuda.device_count()}
        res["link_GBps"] = link_bandwidth()
        torch.cuda.empty_cache()
        log("link", res["link_GBps"])
        res["copy_blocks"] = block_copy_bandwidth(args.copies.split(","))
        res["copy_kernel_failed"] = kv_copy._kernel_failed
        torch.cuda.empty_cache()
        args.out.write_text(json.dumps(res, indent=1))
        model_dir = make_8b_dir(workdir)
        config = json.loads((model_dir / "config.json").read_text())
        config["max_position_embeddings"] = 40960
        (model_dir / "config.json").write_text(json.dumps(config))
        flags = ["--load-format", "dummy", "--max-model-len", "40960", "--max-num-seqs", str(args.max_batch),
                 "--max-graph-batch", str(args.max_batch), "--kv-cache-memory", args.kv_cache_memory,
                 "--health-check-interval", "0"]  # fmt: skip
    variants = parse_variants(args.engine_variants)
    setups = {
        (f"{c}/{name}" if name else c): (c, extra)
        for c in args.engine_copies.split(",")
        for name, extra in variants.items()
    }
    fleets = {
        key: Fleet(workdir, model_dir, "dis-" + re.sub(r"\W", "-", key), flags) for key in setups
    }
    agg = Fleet(workdir, model_dir, "agg", flags)
    dis = next(iter(fleets.values()))
    try:
        for key, fleet in fleets.items():
            copy_method, extra = setups[key]
            fleet.frontend("--disagg-min-prefill-tokens", str(SIZES[0]))
            # Each process lists its own GPU first and the other one second: its pool is on
            # its cuda:0, and the peer's pool opens (CUDA IPC) on that same device index.
            fleet.worker("prefill", "0,1", "--role", "prefill")
            fleet.worker(
                "decode", "1,0", "--role", "decode", "--kv-transfer-copy", copy_method, *extra
            )
        if not args.skip_http:
            agg.frontend()
            agg.worker("agg0", "0,1")
            agg.worker("agg1", "1,0")
        for fleet in fleets.values():
            fleet.wait_ready(1, 1)
        if not args.skip_http:
            agg.wait_ready(2, 0)
        log("fleets ready")
        res["engine_transfer"] = {}
        for key, fleet in fleets.items():
            rng = random.Random(1)
            res["engine_transfer"][key] = engine_transfers(fleet, rng, args.reps)
            args.out.write_text(json.dumps(res, indent=1))
        probe = tokens(random.Random(2), SIZES[1])
        res["same_output"] = args.skip_http or (
            complete(dis.url, probe, 16)["choices"][0]["text"]
            == complete(agg.url, probe, 16)["choices"][0]["text"]
        )
        args.out.write_text(json.dumps(res, indent=1))
        res["http"] = {}
        for name, fleet in (("1P+1D", dis), ("aggregated x2", agg))[: 0 if args.skip_http else 2]:
            res["http"][name] = asyncio.run(mixed_workload(fleet.url, args, seed=7))
            log(name, json.dumps(res["http"][name]))
            args.out.write_text(json.dumps(res, indent=1))
        res["decode_metrics"] = dis.metrics("decode")
        res["prefill_metrics"] = dis.metrics("prefill")
    finally:
        for fleet in (*fleets.values(), agg):
            fleet.stop()
        args.out.write_text(json.dumps(res, indent=1))
        for p in [p for f in (*fleets.values(), agg) for p in f.procs]:
            tail = p.output()[-1500:]
            if "Traceback" in tail or "ERROR" in tail:
                print(f"--- {p.name}\n{tail}", flush=True)
    print(json.dumps(res, indent=1), flush=True)


if __name__ == "__main__":
    main()
