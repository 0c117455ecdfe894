"""Routing policies through HTTP: stator's frontend and Dynamo 1.6.1's frontend, each over a
fleet of 4 mocker workers with the same mocker parameters, driven by `stator bench run`.

    python benchmarks/routing_http.py                      # every system, workload, policy
    python benchmarks/routing_http.py --systems stator --workloads shared-prefix --policies kv

Per (system, policy, workload) a fresh fleet is started (so no run inherits another's
cache), `stator bench run` sends the workload, and its summary.json gives one table row:
TTFT p50/p90/p99, mean inter-token latency, output tokens/s, failed requests (503s are
the router's rejections) and the prefix hit rate (cached prompt tokens the engines report
in `usage.prompt_tokens_details`, over all prompt tokens). A second table gives each fleet
process's CPU time during the load, as a share of one core.

- stator, `--stator-layout one-process` (the default): `stator run --engine mocker
  --workers 4 --router-mode P`, frontend, router and the 4 mockers in one process and one
  event loop, so whatever blocks the frontend (tokenizing a 16k-token prompt) also stalls
  the simulated engines' clocks.
- stator, `--stator-layout processes`: `stator frontend` + 4 `stator worker --engine
  mocker` processes (file discovery, TCP request plane, ZMQ event plane), like Dynamo's
  separate frontend and mocker processes.
- Dynamo: `dynamo.mocker --num-workers 4` + `dynamo.frontend --router-mode P`, file
  discovery, TCP request plane, ZMQ event plane through a loopback XSUB/XPUB broker (so
  nothing binds 0.0.0.0; recipe in ../shared/reference/dynamo-live.md).

Workloads (the mocker runs `--speedup` times real time; the rates below are for
speedup 0.25, i.e. a 4x slower engine, so that saturation comes at request rates the
2-core box's client and frontend can drive; they scale with --speedup):
- `shared-prefix`: 32 tenants' 4,096-token system prompts + 64-token questions, 16
  output tokens, Poisson arrivals.
- `mooncake`: the first `--trace-window` seconds of the Mooncake conversation trace
  (512-token hash blocks), outputs capped at 32 tokens and inputs at 16,384, replayed
  with timestamps multiplied by `--time-scale`.
- `no-reuse`: unique 1,024-token prompts, 16 output tokens, Poisson arrivals.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
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

SHARED = next(
    (p for p in (REPO.parent / "shared", REPO.parent.parent / "shared") if p.is_dir()),
    REPO.parent / "shared",
)
TRACE = SHARED / "data" / "mooncake" / "conversation_trace.jsonl"
DYNAMO_PYTHON = Path("/work/dynamo-venv/bin/python")
MODEL = "bench"
BROKER = """
import sys, zmq
ctx = zmq.Context()
xsub = ctx.socket(zmq.XSUB); xsub.bind(f"tcp://127.0.0.1:{sys.argv[1]}")
xpub = ctx.socket(zmq.XPUB); xpub.bind(f"tcp://127.0.0.1:{sys.argv[2]}")
zmq.proxy(xsub, xpub)
"""


# -- fleets ------------------------------------------------------------------------------


TICKS = os.sysconf("SC_CLK_TCK")


def _stat_fields(pid: int) -> list[str]:
    with open(f"/proc/{pid}/stat") as f:
        # The command name (field 2) may hold spaces: split after its closing parenthesis.
        return f.read().rsplit(")", 1)[1].split()


def _all_parents() -> list[tuple[int, int]]:
    """(pid, parent pid) of every process now running."""
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError, IndexError):
                out.append((int(entry), int(_stat_fields(int(entry))[1])))
    return out


def _cpu_of(pid: int) -> float:
    """User + system CPU seconds of one live process (0 once it is gone)."""
    try:
        fields = _stat_fields(pid)
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / TICKS  # utime, stime


class Fleet:
    """Processes started for one run; stopped (SIGINT, then SIGKILL) in reverse order."""

    def __init__(self, port: int, log_dir: Path) -> None:
        self.port = port
        self.log_dir = log_dir
        self.procs: list[subprocess.Popen] = []
        self.names: list[str] = []

    def spawn(self, name: str, argv: list[str], env: dict[str, str]) -> None:
        self.names.append(name)
        log = open(self.log_dir / f"{name}.log", "wb")  # noqa: SIM115 (closed with the process)
        self.procs.append(
            subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=REPO)
        )

    def wait_ready(self, timeout: float = 120.0, workers: int | None = None) -> None:
        """Until the model is served (and, given `workers`, that many instances are live:
        otherwise a 2 s grace for the rest to register)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for proc in self.procs:
                if proc.poll() is not None:
                    raise RuntimeError(f"a fleet process exited early; logs in {self.log_dir}")
            with contextlib.suppress(OSError, ValueError):
                if workers is not None:
                    url = f"http://127.0.0.1:{self.port}/health"
                    with urllib.request.urlopen(url, timeout=2) as response:
                        live = json.loads(response.read()).get("instances", {}).get(MODEL, [])
                    if len(live) >= workers:
                        return
                else:
                    url = f"http://127.0.0.1:{self.port}/v1/models"
                    with urllib.request.urlopen(url, timeout=2) as response:
                        if MODEL in response.read().decode():
                            time.sleep(2.0)  # let every worker register, not just the first
                            return
            time.sleep(0.5)
        raise RuntimeError(f"fleet not ready after {timeout}s; logs in {self.log_dir}")

    def cpu_seconds(self) -> dict[str, float]:
        """CPU time (user + system) used so far by each spawned process and its
        descendants, by spawn name."""
        children: dict[int, list[int]] = {}
        for pid, ppid in _all_parents():
            children.setdefault(ppid, []).append(pid)
        out = {}
        for name, proc in zip(self.names, self.procs, strict=True):
            total, todo = 0.0, [proc.pid]
            while todo:
                pid = todo.pop()
                total += _cpu_of(pid)
                todo.extend(children.get(pid, []))
            out[name] = total
        return out

    def stop(self) -> None:
        for proc in reversed(self.procs):
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGINT)
        for proc in reversed(self.procs):
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def mocker_args(args, dynamo: bool) -> list[str]:
    blocks = "--num-gpu-blocks-override" if dynamo else "--num-gpu-blocks"
    return [
        blocks, str(args.kv_blocks),
        "--block-size", str(args.block_size),
        "--speedup-ratio", str(args.speedup),
        "--max-num-batched-tokens", str(args.max_batched_tokens),
    ]  # fmt: skip


def start_stator(policy: str, args, model_dir: Path, log_dir: Path) -> Fleet:
    if args.stator_layout == "processes":
        return start_stator_processes(policy, args, model_dir, log_dir)
    fleet = Fleet(free_port(), log_dir)
    argv = [
        sys.executable, "-m", "stator", "run",
        "--engine", "mocker", "--workers", str(args.workers),
        "--router-mode", policy, "--router-seed", "0",
        "--host", "127.0.0.1", "--port", str(fleet.port),
        "--model", str(model_dir), "--served-model-name", MODEL,
        "--context-length", "32768",
        *mocker_args(args, dynamo=False),
    ]  # fmt: skip
    fleet.spawn("stator", argv, repo_env())
    fleet.wait_ready()
    return fleet


def start_stator_processes(policy: str, args, model_dir: Path, log_dir: Path) -> Fleet:
    """`stator frontend` and one `stator worker --engine mocker` process per worker, on
    file discovery, the TCP request plane and the ZMQ event plane: the layout of Dynamo's
    fleet, where frontend and mocker are separate processes too."""
    fleet = Fleet(free_port(), log_dir)
    discovery = ["--discovery", f"file:{log_dir / 'discovery'}", "--event-plane", "zmq"]
    fleet.spawn(
        "frontend",
        [
            sys.executable, "-m", "stator", "frontend", *discovery,
            "--http-host", "127.0.0.1", "--http-port", str(fleet.port),
            "--router-mode", policy, "--router-seed", "0",
        ],
        repo_env(),
    )  # fmt: skip
    for i in range(args.workers):
        fleet.spawn(
            f"worker{i}",
            [
                sys.executable, "-m", "stator", "worker", "--engine", "mocker", *discovery,
                "--model", str(model_dir), "--served-model-name", MODEL,
                "--context-length", "32768", *mocker_args(args, dynamo=False),
            ],
            repo_env(),
        )  # fmt: skip
    fleet.wait_ready(workers=args.workers)
    return fleet


def start_dynamo(policy: str, args, model_dir: Path, log_dir: Path) -> Fleet:
    fleet = Fleet(free_port(), log_dir)
    xsub, xpub = free_port(), free_port()
    home = log_dir / "home"
    (log_dir / "kv").mkdir(parents=True, exist_ok=True)
    home.mkdir(exist_ok=True)
    env = {
        **os.environ,
        "DYN_DISCOVERY_BACKEND": "file",
        "DYN_FILE_KV": str(log_dir / "kv"),
        "DYN_REQUEST_PLANE": "tcp",
        "DYN_EVENT_PLANE": "zmq",
        "DYN_TCP_RPC_HOST": "127.0.0.1",
        "DYN_TCP_RESPONSE_STREAM_HOST": "127.0.0.1",
        "DYN_EVENT_PLANE_HOST": "127.0.0.1",
        "DYN_SYSTEM_HOST": "127.0.0.1",
        "DYN_ZMQ_BROKER_URL": f"xsub=tcp://127.0.0.1:{xsub} , xpub=tcp://127.0.0.1:{xpub}",
        "DYN_SELF_HOST_METADATA": "0",
        "HOME": str(home),
        "XDG_CACHE_HOME": str(home / ".cache"),
        "HF_HOME": str(home / ".cache" / "huggingface"),
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
    }
    env.pop("PYTHONPATH", None)
    py = str(DYNAMO_PYTHON)
    fleet.spawn("broker", [py, "-c", BROKER, str(xsub), str(xpub)], env)
    fleet.spawn(
        "mocker",
        [
            py, "-m", "dynamo.mocker", "--model-path", str(model_dir),
            "--model-name", MODEL, "--num-workers", str(args.workers),
            *mocker_args(args, dynamo=True),
        ],
        env,
    )  # fmt: skip
    fleet.spawn(
        "frontend",
        [
            py, "-m", "dynamo.frontend", "--http-host", "127.0.0.1",
            "--http-port", str(fleet.port), "--router-mode", policy,
        ],
        env,
    )  # fmt: skip
    fleet.wait_ready()
    return fleet


SYSTEMS = {"stator": start_stator, "dynamo": start_dynamo}


# -- workloads ---------------------------------------------------------------------------


def windowed_trace(args, path: Path) -> int:
    """Write the trace's first `trace_window` seconds, outputs and inputs capped, to
    `path`; return the number of requests written."""
    rows = 0
    max_blocks = -(-args.max_input_tokens // 512)
    with open(args.trace) as src, open(path, "w") as dst:
        for line in src:
            row = json.loads(line)
            if row["timestamp"] > args.trace_window * 1000:
                break
            row["input_length"] = min(row["input_length"], args.max_input_tokens)
            row["output_length"] = min(row["output_length"], args.max_output)
            row["hash_ids"] = row["hash_ids"][:max_blocks]
            dst.write(json.dumps(row) + "\n")
            rows += 1
    return rows


def workload_flags(name: str, args, work: Path) -> list[str]:
    rate = lambda r: ["--request-rate", str(r * args.speedup)]  # noqa: E731
    if name == "shared-prefix":
        isl = args.system_tokens + args.question_tokens
        return [
            *rate(args.shared_rate), "--num-requests", str(args.requests),
            "--isl", str(isl), "--osl", str(args.output_tokens),
            "--prefix-ratio", f"{args.system_tokens / isl:.6f}",
            "--num-prefixes", str(args.tenants),
        ]  # fmt: skip
    if name == "no-reuse":
        return [
            *rate(args.no_reuse_rate), "--num-requests", str(args.requests),
            "--isl", str(args.unique_tokens), "--osl", str(args.output_tokens),
        ]  # fmt: skip
    trace = work / "trace.jsonl"
    rows = windowed_trace(args, trace)
    return [
        "--trace", str(trace), "--trace-block-size", "512",
        "--time-scale", str(args.time_scale), "--num-requests", str(rows),
    ]  # fmt: skip


def bench(port: int, flags: list[str], model_dir: Path, out: Path, seed: int) -> dict:
    argv = [
        sys.executable, "-m", "stator", "bench", "run",
        "--url", f"http://127.0.0.1:{port}", "--model", MODEL,
        "--endpoint", "completions", "--tokenizer", str(model_dir),
        "--seed", str(seed), "--timeout", "600",
        "--out", str(out), "--no-plots", "--no-progress", *flags,
    ]  # fmt: skip
    with open(out.parent / f"{out.name}.bench.log", "wb") as log:
        subprocess.run(argv, env=repo_env(), cwd=REPO, stdout=log, stderr=subprocess.STDOUT)
    return json.loads((out / "summary.json").read_text())["points"][0]


def row(system: str, workload: str, policy: str, s: dict) -> str:
    ttft, itl = s["time_to_first_token"], s["inter_token_latency"]
    rejected = s["errors_by_status"].get("503", 0)
    return (
        f"| {workload} | {system} | {policy} | {ttft['p50']:.0f} | {ttft['p90']:.0f} | "
        f"{ttft['p99']:.0f} | {itl['avg']:.1f} | {s['output_token_throughput']['avg']:.0f} | "
        f"{rejected} | {s['failed_requests'] - rejected} | "
        f"{s['cached_token_ratio']['avg']:.1%} |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--systems", default="stator,dynamo")
    parser.add_argument("--workloads", default="shared-prefix,mooncake,no-reuse")
    parser.add_argument("--policies", default="round-robin,least-loaded,kv")
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument(
        "--stator-layout",
        choices=["one-process", "processes"],
        default="one-process",
        help="stator as `stator run` (frontend, router and every worker in one process) or "
        "as a `stator frontend` process + one `stator worker` process per worker",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--work-dir", default=None, help="logs and bench output (default: tmp)")
    fleet = parser.add_argument_group("fleet (mocker, the same for both systems)")
    fleet.add_argument("--speedup", type=float, default=0.25)
    fleet.add_argument("--kv-blocks", type=int, default=1024)
    fleet.add_argument("--trace-kv-blocks", type=int, default=65536, help="for mooncake")
    fleet.add_argument("--block-size", type=int, default=64)
    fleet.add_argument("--max-batched-tokens", type=int, default=8192)
    load = parser.add_argument_group("poisson workloads (rates at speedup 1)")
    load.add_argument("--shared-rate", type=float, default=62.0)
    load.add_argument("--no-reuse-rate", type=float, default=100.0)
    load.add_argument("--requests", type=int, default=600)
    load.add_argument("--output-tokens", type=int, default=16)
    load.add_argument("--tenants", type=int, default=32)
    load.add_argument("--system-tokens", type=int, default=4096)
    load.add_argument("--question-tokens", type=int, default=64)
    load.add_argument("--unique-tokens", type=int, default=1024)
    trace = parser.add_argument_group("mooncake")
    trace.add_argument("--trace", default=str(TRACE))
    trace.add_argument("--trace-window", type=float, default=300.0, help="seconds of trace")
    trace.add_argument("--time-scale", type=float, default=0.8, help="timestamps x this")
    trace.add_argument("--max-input-tokens", type=int, default=16384)
    trace.add_argument("--max-output", type=int, default=32)
    args = parser.parse_args()

    work = Path(args.work_dir or tempfile.mkdtemp(prefix="routing_http_"))
    work.mkdir(parents=True, exist_ok=True)
    model_dir = make_model_dir(work / "model", max_position_embeddings=32768)
    print(f"work dir: {work}", flush=True)
    print(
        "| workload | system | policy | TTFT p50 ms | TTFT p90 ms | TTFT p99 ms | ITL ms | "
        "out tok/s | rejected | failed | prefix hit |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|", flush=True)
    cpu_rows: list[str] = []
    for workload in args.workloads.split(","):
        flags = workload_flags(workload, args, work)
        for system in args.systems.split(","):
            for policy in args.policies.split(","):
                run_dir = work / f"{workload}-{system}-{policy}"
                run_dir.mkdir(parents=True, exist_ok=True)
                fleet_args = argparse.Namespace(**vars(args))
                if workload == "mooncake":
                    fleet_args.kv_blocks = args.trace_kv_blocks
                fleet = SYSTEMS[system](policy, fleet_args, model_dir, run_dir)
                try:
                    cpu_before, started = fleet.cpu_seconds(), time.monotonic()
                    summary = bench(fleet.port, flags, model_dir, run_dir / "bench", args.seed)
                    wall = time.monotonic() - started
                    cpu_after = fleet.cpu_seconds()
                finally:
                    fleet.stop()
                print(row(system, workload, policy, summary), flush=True)
                used = {n: cpu_after[n] - cpu_before.get(n, 0.0) for n in cpu_after}
                (run_dir / "cpu.json").write_text(json.dumps({"wall": wall, "cpu": used}))
                cpu_rows.append(
                    f"| {workload} | {system} | {policy} | {wall:.0f} | "
                    + ", ".join(f"{n} {s / wall:.0%}" for n, s in used.items())
                    + f" | {sum(used.values()) / wall:.0%} |"
                )
    print("\nCPU of the fleet's processes during the load (% of one core, over the bench wall):")
    print("| workload | system | policy | wall s | per process | total |")
    print("|---|---|---|---|---|---|")
    print("\n".join(cpu_rows), flush=True)


if __name__ == "__main__":
    main()
