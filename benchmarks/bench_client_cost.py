"""Client cost of `stator bench`: CPU time of its own process per request, 512-in/64-out
streaming chat against a fast server (`stator run --engine mocker --speedup-ratio 100`,
in its own process).

Each run is a fresh `stator bench run` child process; the figure is its summary's
`client_cpu_per_request`: user + system CPU time of the client's process over the
measured load only (start-up, tokenizer loading and prompt building are outside it),
divided by the requests. With `--pin`, the server runs on CPU 0 and the client on CPU 1,
so that neither takes the other's core. Prints every run, then the min and median.

    flock /work/bench.lock python benchmarks/bench_client_cost.py --requests 1000 --concurrency 8 64 --repeats 3 --pin
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
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


def pinned(cmd: list[str], cpus: str | None) -> list[str]:
    """`cmd` run on the given CPUs (taskset; children inherit it), or as it is."""
    return ["taskset", "-c", cpus, *cmd] if cpus else cmd


@contextlib.contextmanager
def mocker_server(model_dir: Path, speedup: float, cpus: str | None) -> Iterator[str]:
    """`stator run --engine mocker` on `model_dir` (on `cpus` if given), ready; its URL."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    server = subprocess.Popen(
        pinned([sys.executable, "-m", "stator", "--log-level", "WARNING", "run", "--engine",
                "mocker", "--model", str(model_dir), "--served-model-name", "tiny",
                "--host", "127.0.0.1", "--port", str(port),
                "--speedup-ratio", str(speedup)], cpus),
        env=repo_env(), cwd=REPO, stdout=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        wait_ready(url, server)
        yield url
    finally:
        server.terminate()
        server.wait(30)


def bench_once(args, url: str, model_dir: Path, concurrency: int, seed: int) -> dict:
    """One `stator bench run`; the summary of its single load point."""
    with tempfile.TemporaryDirectory() as out:
        cmd = [sys.executable, "-m", "stator", "--log-level", "WARNING", "bench", "run",
               "--url", url, "--model", "tiny", "--tokenizer", str(model_dir), "--isl", "512",
               "--osl", "64", "--concurrency", str(concurrency),
               "--num-requests", str(args.requests), "--warmup", str(concurrency),
               "--seed", str(seed), "--no-plots", "--out", out]  # fmt: skip
        if not args.progress:
            cmd.append("--no-progress")
        subprocess.run(
            pinned(cmd, args.client_cpus), env=repo_env(), cwd=REPO, check=True,
            stdout=subprocess.DEVNULL,
        )  # fmt: skip
        return json.loads((Path(out) / "summary.json").read_text())["points"][0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=1000, help="measured requests per run")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[8, 64])
    parser.add_argument("--repeats", type=int, default=3, help="runs per concurrency")
    parser.add_argument("--speedup-ratio", type=float, default=100.0)
    parser.add_argument("--pin", action="store_true", help="server on CPU 0, client on CPU 1")
    parser.add_argument("--server-cpus", help="pin the server to these CPUs (taskset list)")
    parser.add_argument("--client-cpus", help="pin each client to these CPUs (taskset list)")
    parser.add_argument("--progress", action="store_true", help="with the live progress bar")
    args = parser.parse_args()
    server_cpus, client_cpus = ("0", "1") if args.pin else (None, None)
    server_cpus = args.server_cpus or server_cpus
    args.client_cpus = args.client_cpus or client_cpus

    with tempfile.TemporaryDirectory() as tmp:
        model_dir = make_model_dir(Path(tmp) / "tiny", max_position_embeddings=4096)
        with mocker_server(model_dir, args.speedup_ratio, server_cpus) as url:
            print(
                "| c | run | client CPU ms/request (user + system) | req/s | TTFT p50 ms | errors |"
            )
            print("|---|---|---|---|---|---|")
            for c in args.concurrency:
                costs = []
                for k in range(args.repeats):
                    point = bench_once(args, url, model_dir, c, seed=100 * c + k)
                    cpu = point["client_cpu_per_request"]
                    costs.append(cpu["avg"])
                    print(f"| {c} | {k + 1} | {cpu['avg']:.3f} ({cpu['user']:.3f} + "
                          f"{cpu['system']:.3f}) | {point['request_throughput']['avg']:.1f} | "
                          f"{point['time_to_first_token']['p50']:.2f} | "
                          f"{point['failed_requests']} |", flush=True)  # fmt: skip
                print(f"| {c} | min / median | {min(costs):.3f} / "
                      f"{statistics.median(costs):.3f} | | | |", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
