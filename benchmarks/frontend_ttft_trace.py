"""Where the TTFT a frontend adds goes: one request at a time (no contention), stamped
along its whole path.

Topology as in `frontend_overhead.py --processes`: `stator frontend` + one `stator worker
--engine mocker` process (speedup 100, file discovery, TCP request plane), both run under
`ttft_probes.py`, which stamps each stage with CLOCK_MONOTONIC (shared by every process).
The client is a blocking socket in this process (no event loop), stamping its send and
the arrival of the first content chunk. Each request has its own random 512-token prompt
(no prefix-cache hits), 64 output tokens, streamed.

    flock /work/bench.lock python benchmarks/frontend_ttft_trace.py --requests 200

Prints, per stage, the median time from the client's send, the median step from the
previous stage, and the engine's own TTFT measured inside the worker (the mocker's
`generate` called -> its first output) beside the engine TTFT of the in-process reference
that `frontend_overhead.py --processes` subtracts (under asyncio and under uvloop).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from mocker_fidelity import OSL, Prompts, Workload, mocker_flags, run_in_process  # noqa: E402
from tokenizers import Tokenizer  # noqa: E402

from tests.model_factory import make_model_dir  # noqa: E402
from tests.procs import free_port, repo_env  # noqa: E402

PROBES = str(REPO / "benchmarks" / "ttft_probes.py")
# Stages in path order: (process, stage). The first stamp of each after the client's send.
STAGES = [
    ("frontend", "http_bytes_in"),
    ("frontend", "http_parsed"),
    ("frontend", "route_entered"),
    ("frontend", "body_decoded"),
    ("frontend", "template_start"),
    ("frontend", "template_done"),
    ("frontend", "tokenized"),
    ("frontend", "engine_request_built"),
    ("frontend", "prime_start"),
    ("frontend", "plane_send"),
    ("frontend", "plane_written"),
    ("worker", "worker_bytes_in"),
    ("worker", "worker_frame"),
    ("worker", "worker_task_made"),
    ("worker", "host_generate"),
    ("worker", "engine_generate"),
    ("worker", "engine_step_done"),
    ("worker", "engine_item"),
    ("worker", "host_item"),
    ("worker", "worker_flushed"),
    ("frontend", "plane_bytes_in"),
    ("frontend", "detokenize_start"),
    ("frontend", "detokenized"),
    ("frontend", "primed"),
    ("frontend", "headers_send"),
    ("frontend", "body_send"),
    ("frontend", "body_written"),
    ("client", "first_content"),
]
_CONTENT = re.compile(rb'"content":"[^"]')


class BlockingClient:
    """HTTP/1.1 keep-alive over one blocking socket: no event loop between the wire and
    the time stamps."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.port = port

    def chat(self, prompt: str) -> tuple[int, int]:
        """Send one streamed chat; (send ns, first content chunk ns)."""
        body = json.dumps(
            {
                "model": "tiny",
                "messages": [{"role": "user", "content": prompt}],
                "max_tokens": OSL,
                "min_tokens": OSL,
                "ignore_eos": True,
                "stream": True,
                "stream_options": {"include_usage": True},
            }
        ).encode()
        head = (
            f"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:{self.port}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
        ).encode()
        sent = time.monotonic_ns()
        self.sock.sendall(head + body)
        first = 0
        seen = b""
        while not seen.endswith(b"0\r\n\r\n"):
            data = self.sock.recv(1 << 16)
            now = time.monotonic_ns()
            if not data:
                raise ConnectionError("server closed the connection")
            if not first and _CONTENT.search(seen[-64:] + data):
                first = now
            seen = seen[-64:] + data if b"[DONE]" not in data else seen + data
        assert first, "no content chunk"
        return sent, first


def wait_ready(port: int, procs: list[subprocess.Popen], timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for p in procs:
            if p.poll() is not None:
                raise RuntimeError(f"{p.args[:5]} exited with {p.returncode}")
        try:
            BlockingClient(port).chat(" hello")
            return
        except (OSError, AssertionError):
            time.sleep(0.5)
    raise TimeoutError("the server did not become ready")


def trace(args, model_dir: Path, work: Path, prompts: list[str]) -> dict:
    port = free_port()
    discovery = f"file:{work / 'discovery'}"
    stator = ["--log-level", "WARNING"]
    worker_cmd = [sys.executable, PROBES, "worker", str(work / "worker.json"), "--", *stator,
                  "worker", "--engine", "mocker", "--model", str(model_dir),
                  "--served-model-name", "tiny", "--discovery", discovery,
                  "--host", "127.0.0.1", *mocker_flags(args)]  # fmt: skip
    frontend_cmd = [sys.executable, PROBES, "frontend", str(work / "frontend.json"), "--",
                    *stator, "frontend", "--discovery", discovery, "--host", "127.0.0.1",
                    "--http-host", "127.0.0.1", "--http-port", str(port)]  # fmt: skip
    log = open(work / "server.log", "w")  # noqa: SIM115 - closed below
    procs = [
        subprocess.Popen(cmd, env=repo_env(), stdout=log, stderr=subprocess.STDOUT)
        for cmd in (worker_cmd, frontend_cmd)
    ]
    try:
        wait_ready(port, procs)
        if args.client_nice:
            os.setpriority(os.PRIO_PROCESS, 0, args.client_nice)  # this process only
        client = BlockingClient(port)
        for i in range(20):  # warm up
            client.chat(f" warm up {i}")
        requests = []
        for prompt in prompts:
            requests.append(client.chat(prompt))
            time.sleep(args.gap_ms / 1000)
    finally:
        for p in procs:
            p.send_signal(signal.SIGTERM)
        for p in procs:
            p.wait(30)
        log.close()
    events = {
        "frontend": json.loads((work / "frontend.json").read_text()),
        "worker": json.loads((work / "worker.json").read_text()),
    }
    return {"requests": requests, "events": events}


def timeline(requests: list[tuple[int, int]], events: dict) -> dict[str, list[float]]:
    """Per stage, per request: µs from the client's send to the stage's first stamp."""
    out: dict[str, list[float]] = {stage: [] for _, stage in STAGES}
    for sent, first in requests:
        for proc, stage in STAGES:
            if proc == "client":
                out[stage].append((first - sent) / 1000)
                continue
            t = next((t for s, t in events[proc] if s == stage and sent <= t <= first), None)
            if t is not None:
                out[stage].append((t - sent) / 1000)
    return out


def engine_reference(args, model_dir: Path, prompts: list[str]) -> dict[str, float]:
    """The in-process engine TTFT p50 (ms) that `frontend_overhead.py --processes`
    subtracts, under asyncio (as it runs) and under uvloop (as the worker runs)."""
    import uvloop

    out = {}
    for name, factory in (("asyncio", None), ("uvloop", uvloop.new_event_loop)):
        load = [Workload("c=1", 1, prompts)]
        with asyncio.Runner(loop_factory=factory) as runner:
            results, _ = runner.run(run_in_process(args, model_dir, load))
        out[name] = 1000 * statistics.median(r.ttft for r in results["c=1"])
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--input-tokens", type=int, default=512)
    parser.add_argument("--speedup-ratio", type=float, default=100.0)
    parser.add_argument("--gap-ms", type=float, default=2.0, help="idle time between requests")
    parser.add_argument(
        "--client-nice",
        type=int,
        default=0,
        help="run the client at this nice value (negative: scheduled ahead of the servers)",
    )
    parser.add_argument("--no-reference", action="store_true", help="skip the in-process engine")
    args = parser.parse_args()
    args.num_gpu_blocks, args.block_size = 16384, 64  # as frontend_overhead.py --processes

    work = Path(tempfile.mkdtemp(prefix="ttft-trace-"))
    model_dir = make_model_dir(work / "tiny", max_position_embeddings=32768)
    gen = Prompts(Tokenizer.from_file(str(model_dir / "tokenizer.json")), seed=int(time.time()))
    prompts = [gen.text(args.input_tokens) for _ in range(args.requests)]
    result = trace(args, model_dir, work, prompts)
    stamps = timeline(result["requests"], result["events"])
    (work / "timeline.json").write_text(json.dumps(stamps))

    print(f"c=1, {args.requests} requests, µs from the client's send (medians); run in {work}")
    print("| stage | process | at (p50) | step from previous (p50) | n |")
    print("|---|---|---|---|---|")
    previous: list[float] | None = None
    for proc, stage in STAGES:
        values = stamps[stage]
        if not values:
            continue
        step = ""
        if previous is not None and len(previous) == len(values):
            step = f"{statistics.median(b - a for a, b in zip(previous, values, strict=True)):.0f}"
        print(f"| {stage} | {proc} | {statistics.median(values):.0f} | {step} | {len(values)} |")
        previous = values
    ttft = stamps["first_content"]
    engine = (
        [b - a for a, b in zip(stamps["engine_generate"], stamps["engine_item"], strict=True)]
        if len(stamps["engine_generate"]) == len(stamps["engine_item"]) == len(ttft)
        else []
    )
    summary = {"client_ttft_p50_us": round(statistics.median(ttft), 1)}
    if engine:
        added = [t - e for t, e in zip(ttft, engine, strict=True)]
        summary["engine_ttft_in_worker_p50_us"] = round(statistics.median(engine), 1)
        summary["added_ttft_p50_us"] = round(statistics.median(added), 1)
        summary["added_ttft_p90_us"] = round(statistics.quantiles(added, n=10)[-1], 1)
    if not args.no_reference:
        ref = engine_reference(args, model_dir, prompts[: min(100, len(prompts))])
        summary.update(
            {f"engine_ttft_inproc_{k}_p50_us": round(1000 * v, 1) for k, v in ref.items()}
        )
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
