"""`stator bench` against aiperf 0.13.0 on the same server run: do they measure the same?

One `stator run --engine mocker` (speedup 1: the mocker's simulated GPU timing) serves the
whole comparison; the two clients take turns (stator, aiperf, stator, aiperf by default),
each sending 512-in/64-out streaming chat at a fixed concurrency with prompts built from the
same tokenizer, output lengths forced (ignore_eos, min_tokens) and token counts taken from the
server's usage. aiperf runs from its own venv (`--aiperf`), with HF_HUB_OFFLINE unset (its
0.13.0 bug with local tokenizer dirs, see dynamo-live.md section 5). The last two columns
are the server's own view of each run window: mean TTFT and ITL from the frontend's
/metrics histograms (sum/count deltas; the run's warm-up requests included); the last row
is aiperf's median over its runs divided by stator's. In a closed loop, "turnaround" is how
long a client takes from a response's end to sending the next request in that slot, and
"starts within 5 ms" how bunched its requests start (lockstep cohorts, or spread out):
both shape the load the server sees.

To be fair on a small machine, the server and the clients run on disjoint CPUs (taskset:
the server on `--server-cpus`, either client and all of aiperf's processes on
`--client-cpus`), and aiperf is held to one worker and one record processor
(`--aiperf-workers`), so that neither client slows the server it measures.

    flock /work/bench.lock python benchmarks/bench_vs_aiperf.py --aiperf /work/aiperf-venv/bin/aiperf
"""

from __future__ import annotations

import argparse
import bisect
import json
import os
import statistics
import subprocess
import sys
import tempfile
import urllib.request
from pathlib import Path

from bench_client_cost import pinned, wait_ready

from tests.model_factory import make_model_dir
from tests.procs import REPO, free_port, repo_env

FIELDS = (
    ("request_throughput", "avg", "req/s"),
    ("output_token_throughput", "avg", "output tok/s"),
    ("time_to_first_token", "p50", "TTFT p50 ms"),
    ("time_to_first_token", "avg", "TTFT avg ms"),
    ("inter_token_latency", "p50", "ITL p50 ms"),
    ("inter_token_latency", "avg", "ITL avg ms"),
    ("request_latency", "avg", "E2E avg ms"),
    ("input_sequence_length", "avg", "ISL (server)"),
    ("output_sequence_length", "avg", "OSL (server)"),
)


SERVER_SIDE = {
    "server TTFT avg ms": "stator_frontend_time_to_first_token_seconds",
    "server ITL avg ms": "stator_frontend_inter_token_latency_seconds",
}


def scrape(url: str) -> dict[str, float]:
    """Sums and counts of the frontend's TTFT and ITL histograms (its own clock)."""
    with urllib.request.urlopen(f"{url}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    out: dict[str, float] = {}
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        base = name.split("{", 1)[0]
        if base.removesuffix("_sum").removesuffix("_count") in SERVER_SIDE.values():
            out[base] = out.get(base, 0.0) + float(value)
    return out


def server_side(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """Mean TTFT and ITL the server measured over one client run (warm-up included)."""
    row = {}
    for label, metric in SERVER_SIDE.items():
        total = after[f"{metric}_sum"] - before.get(f"{metric}_sum", 0.0)
        count = after[f"{metric}_count"] - before.get(f"{metric}_count", 0.0)
        row[label] = 1000 * total / count if count else float("nan")
    return row


def run_stator(args, url: str, model_dir: Path, out: Path, seed: int) -> dict:
    cmd = [sys.executable, "-m", "stator", "bench", "run", "--url", url, "--model", "tiny",
           "--tokenizer", str(model_dir), "--isl", str(args.isl), "--osl", str(args.osl),
           "--osl-std", str(args.osl_std),
           "--num-requests", str(args.requests), "--warmup", str(args.warmup),
           "--seed", str(seed), "--no-progress", "--no-plots", "--out", str(out)]  # fmt: skip
    if args.request_rate:
        cmd += ["--request-rate", str(args.request_rate), "--arrival", "constant"]
    else:
        cmd += ["--concurrency", str(args.concurrency)]
    cmd = pinned(cmd, args.client_cpus)
    print("$", " ".join(cmd), file=sys.stderr)
    subprocess.run(cmd, env=repo_env(), cwd=REPO, check=True, stdout=subprocess.DEVNULL)
    point = json.loads((out / "summary.json").read_text())["points"][0]
    row = {f"{m}.{s}": point[m][s] for m, s, _ in FIELDS}
    row["errors"] = point["failed_requests"]
    records = [json.loads(line) for line in (out / "records.jsonl").read_text().splitlines()]
    spans = [(r["start"], r["start"] + r["latency"]) for r in records if r.get("latency")]
    row["turnaround"] = turnaround(spans, args)
    row["bunched"] = bunched([start for start, _ in spans])
    return row


def run_aiperf(args, url: str, model_dir: Path, out: Path, seed: int) -> dict:
    cmd = [args.aiperf, "profile", "--model", "tiny", "--tokenizer", str(model_dir),
           "--url", url, "--endpoint-type", "chat", "--streaming",
           "--synthetic-input-tokens-mean", str(args.isl), "--synthetic-input-tokens-stddev", "0",
           "--output-tokens-mean", str(args.osl), "--output-tokens-stddev", str(args.osl_std),
           "--request-count", str(args.requests),
           "--warmup-request-count", str(args.warmup), "--random-seed", str(seed),
           "--num-dataset-entries", str(args.requests + args.warmup),
           "--cache-bust", "warmup-isolation-first-turn", "--use-server-token-count",
           "--extra-inputs", "ignore_eos:true",
           "--ui", "none", "--no-gpu-telemetry", "--artifact-dir", str(out)]  # fmt: skip
    if not args.osl_std:  # (with varied lengths, ignore_eos alone gives each its max_tokens)
        cmd += ["--extra-inputs", f"min_tokens:{args.osl}"]
    if args.request_rate:
        cmd += ["--request-rate", str(args.request_rate), "--arrival-pattern", "constant"]
    else:
        cmd += ["--concurrency", str(args.concurrency)]
    if args.aiperf_workers:
        cmd += ["--workers-max", str(args.aiperf_workers), "--record-processors", "1"]
    if args.aiperf_no_cache_bust:
        cmd.remove("--cache-bust")
        cmd.remove("warmup-isolation-first-turn")
    cmd = pinned(cmd, args.client_cpus)
    print("$", " ".join(cmd), file=sys.stderr)
    env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "PYTHONPATH")}
    env["AIPERF_DATASET_MMAP_BASE_PATH"] = str(out / "mmap")
    env.update(item.split("=", 1) for item in args.aiperf_env)
    with open(out.parent / f"{out.name}.log", "w") as log:
        subprocess.run(cmd, env=env, check=True, stdout=log, stderr=subprocess.STDOUT)
    data = json.loads(next(out.rglob("profile_export_aiperf.json")).read_text())
    row = {f"{m}.{s}": data[m][s] for m, s, _ in FIELDS}
    error_rate = (data.get("request_error_rate") or {}).get("avg", 0.0)  # percent
    row["errors"] = round(error_rate * data["request_count"]["avg"] / 100)
    lines = next(out.rglob("profile_export.jsonl")).read_text().splitlines()
    meta = [json.loads(line)["metadata"] for line in lines]
    spans = [(m["request_start_ns"] / 1e9, m["request_end_ns"] / 1e9) for m in meta
             if m["benchmark_phase"] == "profiling"]  # fmt: skip
    row["turnaround"] = turnaround(spans, args)
    row["bunched"] = bunched([start for start, _ in spans])
    return row


def bunched(starts: list[float], window: float = 0.005) -> float:
    """How many other requests started within `window` s of each one, on average: a closed
    loop of identical requests tends to run in lockstep cohorts (high), one whose slots
    refill at scattered times does not (low)."""
    ordered = sorted(starts)
    near = [
        bisect.bisect_right(ordered, t + window) - bisect.bisect_left(ordered, t - window) - 1
        for t in ordered
    ]
    return statistics.mean(near) if near else float("nan")


def turnaround(spans: list[tuple[float, float]], args) -> float:
    """Closed loop: mean ms from a request's end to the start of the request that took its
    slot (the i-th end frees the slot of the (c+i)-th start); NaN in an open loop."""
    c = args.concurrency
    if args.request_rate or len(spans) <= c:
        return float("nan")
    starts = sorted(start for start, _ in spans)
    ends = sorted(end for _, end in spans)
    return 1e3 * statistics.mean(starts[c + i] - ends[i] for i in range(len(spans) - c))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--aiperf", default="/work/aiperf-venv/bin/aiperf")
    parser.add_argument("--order", default="stator,aiperf,stator,aiperf")
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument(
        "--request-rate", type=float, default=None, help="open loop at this constant rate instead"
    )
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--warmup", type=int, default=16)
    parser.add_argument("--isl", type=int, default=512)
    parser.add_argument("--osl", type=int, default=64)
    parser.add_argument(
        "--osl-std", type=float, default=0.0,
        help="standard deviation of the output length (both clients draw their own lengths)",
    )  # fmt: skip
    parser.add_argument("--speedup-ratio", type=float, default=1.0)
    parser.add_argument("--server-cpus", default="0", help="taskset CPU list ('' = no pin)")
    parser.add_argument("--client-cpus", default="1", help="taskset CPU list for both clients")
    parser.add_argument("--aiperf-workers", type=int, default=1, help="0 = aiperf's default")
    parser.add_argument(
        "--aiperf-env", action="append", default=[], metavar="KEY=VALUE",
        help="an environment setting for aiperf (e.g. AIPERF_DATASET_PREFORMAT_PAYLOADS=true)",
    )  # fmt: skip
    parser.add_argument(
        "--aiperf-no-cache-bust", action="store_true",
        help="without --cache-bust (aiperf then may use its pre-encoded payload fast path)",
    )  # fmt: skip
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="bench-vs-aiperf-"))
    model_dir = make_model_dir(work / "tiny", max_position_embeddings=4096)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    server_cmd = [sys.executable, "-m", "stator", "--log-level", "WARNING", "run", "--engine",
                  "mocker", "--model", str(model_dir), "--served-model-name", "tiny",
                  "--host", "127.0.0.1", "--port", str(port),
                  "--speedup-ratio", str(args.speedup_ratio)]  # fmt: skip
    server_cmd = pinned(server_cmd, args.server_cpus)
    print("$", " ".join(server_cmd), file=sys.stderr)
    server = subprocess.Popen(server_cmd, env=repo_env(), cwd=REPO)
    rows = []
    try:
        wait_ready(url, server)
        for k, client in enumerate(args.order.split(",")):
            out = work / f"{k + 1}-{client}"
            out.mkdir()
            run = run_stator if client == "stator" else run_aiperf
            before = scrape(url)
            row = run(args, url, model_dir, out, seed=100 + k)
            # Little's law: the requests the client really kept in flight on average
            row["in flight"] = row["request_throughput.avg"] * row["request_latency.avg"] / 1e3
            row.update(server_side(before, scrape(url)))
            rows.append((f"{client} #{k + 1}", row))
    finally:
        server.terminate()
        server.wait(30)
    print(f"(artifacts in {work})", file=sys.stderr)
    labels = [label for *_, label in FIELDS]
    labels += ["errors", "turnaround ms (avg)", "starts within 5 ms (avg)", "in flight (avg)"]
    labels += list(SERVER_SIDE)
    print("| client (run order) | " + " | ".join(labels) + " |")
    print("|---" * (len(labels) + 1) + "|")
    for name, row in rows:
        print(f"| {name} | " + " | ".join(f"{v:.2f}" for v in row.values()) + " |")
    print(ratio_row(rows, labels))


def ratio_row(rows: list[tuple[str, dict]], labels: list[str]) -> str:
    """aiperf's median over its runs divided by stator's, per column."""
    by_client: dict[str, list[dict]] = {}
    for name, row in rows:
        by_client.setdefault(name.split(" ")[0], []).append(row)
    if set(by_client) != {"stator", "aiperf"}:
        return ""
    cells = []
    for key in rows[0][1]:
        a = statistics.median(r[key] for r in by_client["aiperf"])
        b = statistics.median(r[key] for r in by_client["stator"])
        cells.append(f"{a / b:.3f}" if b else "-")
    return "| aiperf / stator (medians) | " + " | ".join(cells) + " |"


if __name__ == "__main__":
    main()
