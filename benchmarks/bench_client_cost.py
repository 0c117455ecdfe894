"""Client cost of `stator bench`: CPU time per request of its own process, 512-in/64-out
streaming chat against a fast server (`stator run --engine mocker --speedup-ratio 100`).

`stator bench run` is run twice as a child process, with N and 2N measured requests; the
difference of its CPU time (user + system, from wait4's rusage) divided by N is the cost of
one request, with start-up (imports, tokenizer, prompt building) cancelled out.

    python benchmarks/bench_client_cost.py --requests 400 --concurrency 8 64
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.model_factory import make_model_dir  # noqa: E402
from tests.procs import free_port, repo_env  # noqa: E402


def wait_ready(url: str, server: subprocess.Popen, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise RuntimeError("the server exited")
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=2) as resp:
                if resp.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.5)
    raise TimeoutError("the server did not become ready")


def bench_cpu(url: str, model_dir: Path, requests: int, concurrency: int, seed: int) -> dict:
    """Run `stator bench run` once; its CPU seconds and its summary."""
    with tempfile.TemporaryDirectory() as out:
        cmd = [sys.executable, "-m", "stator", "--log-level", "WARNING", "bench", "run",
               "--url", url, "--tokenizer", str(model_dir), "--isl", "512", "--osl", "64",
               "--concurrency", str(concurrency), "--num-requests", str(requests),
               "--seed", str(seed), "--no-progress", "--no-plots", "--out", out]  # fmt: skip
        proc = subprocess.Popen(cmd, env=repo_env(), cwd=REPO, stdout=subprocess.DEVNULL)
        _, status, usage = os.wait4(proc.pid, 0)
        if os.waitstatus_to_exitcode(status) != 0:
            raise RuntimeError(f"stator bench failed: {' '.join(cmd)}")
        summary = json.loads((Path(out) / "summary.json").read_text())
    return {
        "cpu_s": usage.ru_utime + usage.ru_stime,
        "sys_s": usage.ru_stime,
        "summary": summary["points"][0],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=400, help="N (the second run sends 2N)")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[8, 64])
    parser.add_argument("--speedup-ratio", type=float, default=100.0)
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        model_dir = make_model_dir(Path(tmp) / "tiny", max_position_embeddings=4096)
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        server = subprocess.Popen(
            [sys.executable, "-m", "stator", "--log-level", "WARNING", "run", "--engine",
             "mocker", "--model", str(model_dir), "--served-model-name", "tiny",
             "--host", "127.0.0.1", "--port", str(port),
             "--speedup-ratio", str(args.speedup_ratio)],
            env=repo_env(), cwd=REPO,
        )  # fmt: skip
        try:
            wait_ready(url, server)
            print("| concurrency | bench CPU ms/request (of which kernel) | run N: CPU s, req/s | run 2N: CPU s, "
                  "req/s | TTFT p50 ms (2N) |")  # fmt: skip
            print("|---|---|---|---|---|")
            for c in args.concurrency:
                small = bench_cpu(url, model_dir, args.requests, c, seed=c)
                large = bench_cpu(url, model_dir, 2 * args.requests, c, seed=1000 + c)
                per_request = (large["cpu_s"] - small["cpu_s"]) / args.requests
                kernel = (large["sys_s"] - small["sys_s"]) / args.requests
                s, big = small["summary"], large["summary"]
                print(f"| {c} | {1000 * per_request:.3f} ({1000 * kernel:.3f}) | {small['cpu_s']:.2f}, "
                      f"{s['request_throughput']['avg']:.1f} | {large['cpu_s']:.2f}, "
                      f"{big['request_throughput']['avg']:.1f} | {big['time_to_first_token']['p50']:.2f} |")  # fmt: skip
        finally:
            server.terminate()
            server.wait(30)


if __name__ == "__main__":
    main()
