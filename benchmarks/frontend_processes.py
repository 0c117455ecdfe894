"""`frontend_overhead.py --processes`: stator's frontend process against Dynamo 1.6.1's, each
in front of one mocker worker process at speedup 100 (see frontend_overhead.py's docstring).
The servers are mocker_fidelity.py's; the client is `stator bench run`, the lightest we
have, one run per concurrency, its process not counted."""

from __future__ import annotations

import argparse
import asyncio
import json
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
from mocker_fidelity import (
    Prompts,
    Server,
    Workload,
    cpu_seconds,
    dynamo_server,
    mocker_flags,
    run_in_process,
    stator_env,
)
from tokenizers import Tokenizer

from tests.model_factory import make_model_dir
from tests.procs import child_pids

PROBES = str(Path(__file__).resolve().parent / "ttft_probes.py")

# Runs a command with its CPU affinity set (os.sched_setaffinity, then exec): `taskset`
# without needing util-linux on the host. Usage: python -c PIN_EXEC CPUS CMD...
PIN_EXEC = (
    "import os, sys\n"
    "cpus = set()\n"
    "for part in sys.argv[1].split(','):\n"
    "    lo, _, hi = part.partition('-')\n"
    "    cpus.update(range(int(lo), int(hi or lo) + 1))\n"
    "os.sched_setaffinity(0, cpus)\n"
    "os.execvp(sys.argv[2], sys.argv[2:])\n"
)


def pinned(cpus: str | None, cmd: list[str]) -> list[str]:
    """`cmd`, run on the CPUs of the list `cpus` ("4" or "0-3,8"), or as is when None."""
    return cmd if cpus is None else [sys.executable, "-c", PIN_EXEC, cpus, *cmd]


def stator_procs_server(args, model_dir: Path, run_dir: Path) -> Server:
    """mocker_fidelity's "procs" topology (`stator frontend` + one `stator worker
    --engine mocker` process), with the worker run under `ttft_probes.py engine`: it
    stamps, per request, when the mocker's `generate` was called and when its first
    output came, into run_dir/engine.json at exit (two stamps per request, nothing per
    token). That is the engine's own TTFT in the same run, under the worker's event loop
    (uvloop), which the added TTFT is computed against."""
    from tests.procs import free_port

    server = Server(run_dir, free_port())
    discovery = f"file:{run_dir / 'discovery'}"
    env = stator_env()
    stator = ["--log-level", "WARNING"]
    pin = args.pin or (None, None, None)
    server.start("mocker", pinned(pin[2], [sys.executable, PROBES, "engine", str(run_dir / "engine.json"),
                            "--", *stator, "worker", "--engine", "mocker",
                            "--model", str(model_dir), "--served-model-name", "tiny",
                            "--discovery", discovery, "--host", "127.0.0.1",
                            *mocker_flags(args)]), env)  # fmt: skip
    frontend = [sys.executable, "-m", "stator"]
    if args.trace_frontend:
        frontend = [sys.executable, PROBES, "requests", str(run_dir / "requests.json"), "--"]
    server.start("frontend", pinned(pin[1], [*frontend, *stator, "frontend",
                              "--discovery", discovery, "--host", "127.0.0.1",
                              "--http-host", "127.0.0.1",
                              "--http-port", server.url.rsplit(":", 1)[1],
                              "--api-server-count", str(args.servers),
                              *shlex.split(args.frontend_flags)]), env)  # fmt: skip
    return server


def frontend_cpu(server: Server) -> dict[str, float]:
    """`server.cpu()`, with the frontend's figure summed over its process and its
    children: the `--api-server-count` servers (and multiprocessing's resource tracker,
    idle). With one server there are none and this is `server.cpu()`."""
    cpu = server.cpu()
    if "frontend" in server.cpu_pids:
        for pid in child_pids(server.cpu_pids["frontend"]):
            cpu["frontend"] += cpu_seconds(pid)
    return cpu


# Per-request frontend stages (`ttft_probes.py requests`), in order, for --trace-frontend.
FRONTEND_STEPS = [
    ("created", "task_ran", "headers parsed → request task runs"),
    ("task_ran", "body_decoded_start", "→ route entered"),
    ("body_decoded_start", "tokenized", "→ body, template, tokenized"),
    ("tokenized", "plane_sent", "→ sampling, router, sent to worker"),
    ("plane_sent", "primed", "→ first output back (worker + engine)"),
    ("primed", "first_write", "→ first token written"),
    ("created", "first_write", "headers parsed → first token written"),
]


def frontend_steps(path: Path, windows: dict[int, tuple[int, int]]) -> dict[int, dict]:
    """Per concurrency: the median of each step (ms) over the requests made in its run."""
    requests = json.loads(path.read_text())
    out = {}
    for c, (began, ended) in windows.items():
        mine = [r for r in requests if began <= r["created"] <= ended]
        out[c] = {}
        for a, b, label in FRONTEND_STEPS:
            # A stage stamped outside the request's task (older code primed in a task of
            # its own) has no value: nan.
            steps = [(r[b] - r[a]) / 1e6 for r in mine if a in r and b in r]
            out[c][label] = statistics.median(steps) if steps else float("nan")
    return out


SERVERS = {"procs": ("stator frontend", stator_procs_server), "dynamo": ("dynamo", dynamo_server)}


def bench(
    url: str,
    model_dir: Path,
    requests: int,
    concurrency: int,
    seed: int,
    nice: int = 0,
    cpus: str | None = None,
) -> dict:
    """One `stator bench run` (the lightest client we have); its summary point. `nice`:
    the client's nice value (negative: scheduled ahead of the servers, so that its own
    wait for a CPU is not counted as the server's latency); `cpus`: the CPUs it runs on."""
    with tempfile.TemporaryDirectory() as out:
        client = pinned(cpus, [sys.executable])
        cmd = [*(["nice", "-n", str(nice)] if nice else []), *client, "-m", "stator", "bench", "run", "--url", url, "--model", "tiny",
               "--tokenizer", str(model_dir), "--isl", "512", "--osl", "64",
               "--concurrency", str(concurrency), "--num-requests", str(requests),
               "--seed", str(seed), "--no-progress", "--no-plots", "--out", out]  # fmt: skip
        subprocess.run(cmd, env=stator_env(), check=True, stdout=subprocess.DEVNULL)
        return json.loads((Path(out) / "summary.json").read_text())["points"][0]


async def wait_ready(server: Server) -> None:
    async with aiohttp.ClientSession() as session:
        await server.wait_ready(session)


def measure(key: str, servers: int, args, model_dir: Path, run_dir: Path) -> dict[int, dict]:
    """Start one system, load it at each concurrency; per concurrency: CPU, the summary
    and (stator) the engine's own TTFT p50 in ms, stamped in the worker."""
    args.servers = servers
    server = SERVERS[key][1](args, model_dir, run_dir)
    out = {}
    windows = {}
    try:
        asyncio.run(wait_ready(server))
        client_cpus = args.pin[0] if args.pin else None
        bench(server.url, model_dir, 64, 8, seed=1, cpus=client_cpus)  # warm up
        for c in args.concurrency:
            before = frontend_cpu(server)
            began = time.monotonic_ns()
            point = bench(server.url, model_dir, args.requests, c, 1000 + c, args.client_nice,
                          client_cpus)  # fmt: skip
            windows[c] = (began, time.monotonic_ns())
            after = frontend_cpu(server)
            cpu = {k: (after[k] - before[k]) / args.requests for k in after}
            out[c] = {"cpu": cpu, "point": point}
    finally:
        server.stop()
    if (run_dir / "requests.json").exists():
        for c, steps in frontend_steps(run_dir / "requests.json", windows).items():
            out[c]["frontend_steps"] = steps
    stamps_file = run_dir / "engine.json"
    if stamps_file.exists():
        stamps = json.loads(stamps_file.read_text())
        for c, (began, ended) in windows.items():
            ttfts = [(t1 - t0) / 1e6 for _, t0, t1 in stamps if began <= t0 <= ended]
            out[c]["engine_ttft"] = statistics.median(ttfts)
    return out


def compare_processes(args: argparse.Namespace) -> None:
    args.num_gpu_blocks, args.block_size = 16384, 64  # Dynamo's mocker defaults
    work = Path(tempfile.mkdtemp(prefix="frontend-procs-"))
    model_dir = make_model_dir(work / "tiny", max_position_embeddings=32768)
    runs = []
    # Each stator run once per --api-server-count value; Dynamo's frontend has no such flag.
    plan = [(key, n) for key in args.systems.split(",")
            for n in (args.api_server_count if key == "procs" else [1])]  # fmt: skip
    for k, (key, n) in enumerate(plan):
        run_dir = work / f"{k + 1}-{key}-{n}"
        run_dir.mkdir()
        label = SERVERS[key][0] + (f" ×{n}" if n > 1 or len(args.api_server_count) > 1 else "")
        runs.append((f"{label} #{k + 1}", measure(key, n, args, model_dir, run_dir)))
    # The engine's own TTFT is stamped in stator's worker (see stator_procs_server); the
    # same mocker driven in-process through the Engine API (plain asyncio, no HTTP, no
    # transport: what this script subtracted before) is printed beside it.
    prompts = Prompts(Tokenizer.from_file(str(model_dir / "tokenizer.json")), seed=11)
    loads = [
        Workload(f"c={c}", c, [prompts.text(args.input_tokens) for _ in range(args.requests)])
        for c in args.concurrency
    ]
    inproc, _ = asyncio.run(run_in_process(args, model_dir, loads))
    print(f"(run directories under {work})", file=sys.stderr)

    # "cores busy": CPU per request × requests per second, the CPU time each process
    # used per second of the run (1.0: one core, all the time; a one-process frontend or
    # worker near 1 is saturated, and requests queue for it).
    print("| system (run order) | concurrency | frontend CPU ms/request | mocker CPU ms/request "
          "| client CPU ms/request | req/s | frontend cores busy | mocker cores busy "
          "| client TTFT p50 ms | engine TTFT p50 ms | added TTFT p50 ms | ITL p50 ms |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for w in loads:
        in_worker = [r[w.concurrency]["engine_ttft"] for _, r in runs
                     if "engine_ttft" in r[w.concurrency]]  # fmt: skip
        # Dynamo's mocker cannot be stamped from here: its rows use stator's worker's
        # figure for the same concurrency (the two mockers share the timing model).
        fallback = statistics.median(in_worker) if in_worker else float("nan")
        for label, result in runs:
            cpu, point = result[w.concurrency]["cpu"], result[w.concurrency]["point"]
            engine_ttft = result[w.concurrency].get("engine_ttft", fallback)
            ttft = point["time_to_first_token"]["p50"]
            rate = point["request_throughput"]["avg"]
            client = point.get("client_cpu_per_request", {}).get("avg", float("nan"))
            row = [label, w.concurrency, 1000 * cpu["frontend"], 1000 * cpu["mocker"], client,
                   rate, cpu["frontend"] * rate, cpu["mocker"] * rate,
                   ttft, engine_ttft, ttft - engine_ttft,
                   point["inter_token_latency"]["p50"]]  # fmt: skip
            print("| " + " | ".join(f"{v:.2f}" if isinstance(v, float) else str(v)
                                    for v in row) + " |")  # fmt: skip
    traced = [(label, r) for label, r in runs if "frontend_steps" in r[args.concurrency[0]]]
    if traced:
        print("\nstator frontend, per request (ms, medians; `ttft_probes.py requests`):")
        print("| run | c | " + " | ".join(label for _, _, label in FRONTEND_STEPS) + " |")
        print("|---|---|" + "---|" * len(FRONTEND_STEPS))
        for w in loads:
            for label, result in traced:
                steps = result[w.concurrency]["frontend_steps"]
                print(f"| {label} | {w.concurrency} | "
                      + " | ".join(f"{steps[s]:.2f}" for _, _, s in FRONTEND_STEPS) + " |")  # fmt: skip
    for w in loads:
        engine_ttft = 1000 * statistics.median(r.ttft for r in inproc[w.name])
        print(f"in-process engine TTFT p50 (asyncio, no transport), c={w.concurrency}: "
              f"{engine_ttft:.2f} ms")  # fmt: skip
