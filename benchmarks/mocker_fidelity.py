"""Does stator's mocker behave like Dynamo's? Same workloads, same parameters, both mockers.

Both are driven over HTTP on 127.0.0.1 by the same closed-loop streaming chat client with
the same prompts (ignore_eos, min_tokens = max_tokens = 64):
- Dynamo 1.6.1: its frontend + mocker (+ a loopback ZMQ broker), installed in a venv outside
  the repo (see /work/shared/reference/dynamo-live.md);
- stator: the mocker behind `mocker_http_shim.py` (template, tokenizer, SSE), one process,
  until `stator run --engine mocker` exists;
- stator in-process: the same mocker and client logic through the Engine API, no HTTP.

    python benchmarks/mocker_fidelity.py --dynamo-python /work/dynamo-venv/bin/python

Prints a table row per (workload, system): TTFT and ITL medians, prefix-cache hits and the
servers' CPU time per request."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import jinja2
from tokenizers import Tokenizer

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from stator.engines.mocker import MockerConfig, create_engine
from stator.protocols import EngineRequest, StopConditions
from tests.model_factory import make_model_dir

OSL = 64


@dataclass
class Workload:
    name: str
    concurrency: int
    prompts: list[str]


@dataclass
class Result:
    ttft: float  # seconds
    itl: float  # seconds, mean gap of this request
    tokens: int
    prompt_tokens: int
    cached_tokens: int


# -- prompts -------------------------------------------------------------------------


class Prompts:
    """Random-word prompts of an exact token length (the tokenizer's byte-level
    pre-tokenizer splits on spaces, so word token counts add up)."""

    def __init__(self, tokenizer: Tokenizer, seed: int) -> None:
        self.tok = tokenizer
        self.rng = random.Random(seed)
        vocab = [w for w in tokenizer.get_vocab() if w.isalpha() and w.isascii() and len(w) > 2]
        self.words = sorted(vocab)
        self.cost = {w: len(tokenizer.encode(" " + w).ids) for w in self.words}

    def text(self, n_tokens: int) -> str:
        out, total = [], 0
        while total < n_tokens:
            w = self.rng.choice(self.words)
            if total + self.cost[w] > n_tokens:
                continue
            out.append(w)
            total += self.cost[w]
        return " " + " ".join(out)


def workloads(tokenizer: Tokenizer, requests: int) -> list[Workload]:
    p = Prompts(tokenizer, seed=7)
    # c=1 shows the timing model itself: no batching, no arrival effects.
    out = [Workload("512-in/64-out c=1", 1, [p.text(512) for _ in range(max(requests // 8, 4))])]
    for c in (8, 32):
        out.append(Workload(f"512-in/64-out c={c}", c, [p.text(512) for _ in range(requests)]))
    prefixes = [p.text(448) for _ in range(8)]
    shared = [random.Random(i).choice(prefixes) + p.text(64) for i in range(requests)]
    out.append(Workload("shared prefix (8×448 + 64 unique) c=16", 16, shared))
    return out


# -- closed-loop driver --------------------------------------------------------------


async def closed_loop(concurrency: int, prompts: list[str], one) -> list[Result]:
    """`concurrency` clients, each sending its next prompt as soon as its last one ends."""
    queue = list(prompts)
    results: list[Result] = []

    async def worker() -> None:
        while queue:
            results.append(await one(queue.pop(0)))

    await asyncio.gather(*[worker() for _ in range(concurrency)])
    return results


def result(start: float, stamps: list[tuple[float, int]], prompt: int, cached: int) -> Result:
    first = stamps[0][0]
    last = stamps[-1][0]
    tokens = sum(n for _, n in stamps)
    itl = (last - first) / (tokens - 1) if tokens > 1 else 0.0
    return Result(first - start, itl, tokens, prompt, cached)


# -- Dynamo over HTTP ----------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


BROKER = """
import sys, zmq
ctx = zmq.Context()
xsub = ctx.socket(zmq.XSUB); xsub.bind(f"tcp://127.0.0.1:{sys.argv[1]}")
xpub = ctx.socket(zmq.XPUB); xpub.bind(f"tcp://127.0.0.1:{sys.argv[2]}")
zmq.proxy(xsub, xpub)
"""


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Server:
    """Processes serving streaming chat on 127.0.0.1; stopped by PID."""

    def __init__(self, run_dir: Path, port: int) -> None:
        self.url = f"http://127.0.0.1:{port}"
        self.log = open(run_dir / "server.log", "w")  # noqa: SIM115 - closed in stop()
        self.procs: list[subprocess.Popen] = []
        self.cpu_pids: dict[str, int] = {}  # name -> pid whose CPU time is reported

    def start(self, name: str, cmd: list[str], env: dict[str, str], measure: bool = True) -> None:
        proc = subprocess.Popen(cmd, env=env, stdout=self.log, stderr=subprocess.STDOUT)
        self.procs.append(proc)
        if measure:
            self.cpu_pids[name] = proc.pid

    def cpu(self) -> dict[str, float]:
        return {name: cpu_seconds(pid) for name, pid in self.cpu_pids.items()}

    async def wait_ready(self, session: aiohttp.ClientSession, timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for p in self.procs:
                if p.poll() is not None:
                    raise RuntimeError(f"{p.args[:4]} exited; see {self.log.name}")
            try:
                await self.chat(session, " hello", max_tokens=1)
                return
            except (aiohttp.ClientError, RuntimeError, KeyError, IndexError):
                await asyncio.sleep(0.5)
        raise TimeoutError("the server did not become ready")

    async def chat(self, session, prompt: str, max_tokens: int = OSL) -> Result:
        body = {
            "model": "tiny",
            "messages": [{"role": "user", "content": prompt}],
            "max_tokens": max_tokens,
            "min_tokens": max_tokens,
            "ignore_eos": True,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        stamps: list[tuple[float, int]] = []
        usage = {}
        start = time.perf_counter()
        async with session.post(f"{self.url}/v1/chat/completions", json=body) as resp:
            if resp.status != 200:
                raise RuntimeError(f"HTTP {resp.status}: {await resp.text()}")
            async for raw in resp.content:
                line = raw.strip()
                if not line.startswith(b"data:") or line == b"data: [DONE]":
                    continue
                chunk = json.loads(line[5:])
                if chunk.get("usage"):
                    usage = chunk["usage"]
                for choice in chunk.get("choices", []):
                    if choice.get("delta", {}).get("content"):
                        stamps.append((time.perf_counter(), 1))
        details = usage.get("prompt_tokens_details") or {}
        return result(
            start, stamps, usage.get("prompt_tokens", 0), details.get("cached_tokens") or 0
        )

    def stop(self) -> None:
        for p in reversed(self.procs):
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in reversed(self.procs):
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        self.log.close()


def dynamo_server(args, model_dir: Path, run_dir: Path) -> Server:
    """Dynamo 1.6.1: ZMQ broker + mocker + frontend, every socket on loopback."""
    server = Server(run_dir, free_port())
    xsub, xpub = free_port(), free_port()
    (run_dir / "kv").mkdir(parents=True, exist_ok=True)
    home = run_dir / "home"
    env = dict(os.environ)
    env.update(
        DYN_DISCOVERY_BACKEND="file",
        DYN_FILE_KV=str(run_dir / "kv"),
        DYN_REQUEST_PLANE="tcp",
        DYN_EVENT_PLANE="zmq",
        DYN_TCP_RPC_HOST="127.0.0.1",
        DYN_TCP_RESPONSE_STREAM_HOST="127.0.0.1",
        DYN_EVENT_PLANE_HOST="127.0.0.1",
        DYN_SYSTEM_HOST="127.0.0.1",
        DYN_ZMQ_BROKER_URL=f"xsub=tcp://127.0.0.1:{xsub} , xpub=tcp://127.0.0.1:{xpub}",
        DYN_SELF_HOST_METADATA="0",
        DYN_LOG="warn",
        HOME=str(home),
        XDG_CACHE_HOME=str(home / ".cache"),
        HF_HOME=str(home / ".cache/huggingface"),
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
    )
    py = args.dynamo_python
    server.start("broker", [py, "-c", BROKER, str(xsub), str(xpub)], env, measure=False)
    server.start("mocker", [py, "-m", "dynamo.mocker", "--model-path", str(model_dir),
                            "--model-name", "tiny",
                            "--num-gpu-blocks-override", str(args.num_gpu_blocks),
                            "--block-size", str(args.block_size), "--max-num-seqs", "256",
                            "--max-num-batched-tokens", "8192",
                            "--speedup-ratio", str(args.speedup_ratio)], env)  # fmt: skip
    server.start("frontend", [py, "-m", "dynamo.frontend", "--http-host", "127.0.0.1",
                              "--http-port", server.url.rsplit(":", 1)[1],
                              "--router-mode", "round-robin"], env)  # fmt: skip
    return server


def stator_server(args, model_dir: Path, run_dir: Path) -> Server:
    """stator's mocker behind the benchmark's HTTP shim, in one process."""
    server = Server(run_dir, free_port())
    shim = Path(__file__).resolve().parent / "mocker_http_shim.py"
    server.start("mocker+shim", [sys.executable, str(shim),
                                 "--port", server.url.rsplit(":", 1)[1],
                                 "--model-dir", str(model_dir),
                                 "--num-gpu-blocks", str(args.num_gpu_blocks),
                                 "--block-size", str(args.block_size),
                                 "--speedup-ratio", str(args.speedup_ratio)], dict(os.environ))  # fmt: skip
    return server


async def run_system(make_server, args, model_dir: Path, loads: list[Workload]):
    """Run every workload against one fresh server; returns results and CPU per workload."""
    run_dir = Path(tempfile.mkdtemp(prefix="mocker-fidelity-run-"))
    server = make_server(args, model_dir, run_dir)
    out, cpu = {}, {}
    try:
        timeout = aiohttp.ClientTimeout(total=600)
        conn = aiohttp.TCPConnector(limit=0)
        async with aiohttp.ClientSession(timeout=timeout, connector=conn) as session:
            await server.wait_ready(session)
            for w in loads:
                warm = [f" warm up {i}" for i in range(w.concurrency)]
                await closed_loop(w.concurrency, warm, lambda p: server.chat(session, p))
                before = server.cpu()
                out[w.name] = await closed_loop(
                    w.concurrency, w.prompts, lambda p: server.chat(session, p)
                )
                after = server.cpu()
                cpu[w.name] = {k: (after[k] - before[k]) / len(w.prompts) for k in after}
    finally:
        server.stop()
    print(f"(server logs in {run_dir})", file=sys.stderr)
    return out, cpu


async def run_in_process(args, model_dir: Path, loads: list[Workload]):
    """stator's mocker through the Engine API in this process: the same prompts (rendered
    and tokenized up front, exactly as the shim does) and the same closed-loop clients,
    without HTTP. Shows the scheduling and timing model without transport or CPU
    contention effects. CPU per request includes the in-process clients."""
    tok = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    template = jinja2.Template(
        json.loads((model_dir / "tokenizer_config.json").read_text())["chat_template"]
    )
    config = MockerConfig(
        num_gpu_blocks=args.num_gpu_blocks,
        block_size=args.block_size,
        speedup_ratio=args.speedup_ratio,
    )
    engine = create_engine(config, str(model_dir), "tiny")
    await engine.start()
    texts = {p for w in loads for p in w.prompts} | {f" warm up {i}" for i in range(64)}
    encoded = {
        t: tok.encode(
            template.render(messages=[{"role": "user", "content": t}], add_generation_prompt=True),
            add_special_tokens=False,
        ).ids
        for t in texts
    }
    ids = iter(range(10**9))

    async def one(prompt: str) -> Result:
        req = EngineRequest(
            request_id=f"r{next(ids)}",
            model="tiny",
            token_ids=encoded[prompt],
            stop=StopConditions(max_tokens=OSL, min_tokens=OSL, ignore_eos=True),
        )
        stamps, cached = [], 0
        start = time.perf_counter()
        async for out in engine.generate(req):
            if out.cached_tokens is not None:
                cached = out.cached_tokens
            if out.token_ids:
                stamps.append((time.perf_counter(), len(out.token_ids)))
        return result(start, stamps, len(req.token_ids), cached)

    out, cpu = {}, {}
    try:
        for w in loads:
            await closed_loop(w.concurrency, [f" warm up {i}" for i in range(w.concurrency)], one)
            before = time.process_time()
            out[w.name] = await closed_loop(w.concurrency, w.prompts, one)
            cpu[w.name] = {"mocker+clients": (time.process_time() - before) / len(w.prompts)}
    finally:
        await engine.shutdown()
    return out, cpu


# -- report --------------------------------------------------------------------------


def summarize(results: list[Result]) -> dict[str, float]:
    return {
        "ttft_ms": statistics.median(r.ttft for r in results) * 1000,
        "itl_ms": statistics.median(r.itl for r in results) * 1000,
        "prompt": statistics.mean(r.prompt_tokens for r in results),
        "hits": sum(1 for r in results if r.cached_tokens),
        "cached": sum(r.cached_tokens for r in results),
        "n": len(results),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dynamo-python", default="/work/dynamo-venv/bin/python")
    parser.add_argument("--requests", type=int, default=160, help="per workload")
    parser.add_argument("--speedup-ratio", type=float, default=1.0)
    parser.add_argument("--num-gpu-blocks", type=int, default=16384)
    parser.add_argument("--block-size", type=int, default=64)
    parser.add_argument("--only", choices=["stator", "dynamo"], default=None)
    args = parser.parse_args()

    model_dir = make_model_dir(Path(tempfile.mkdtemp(prefix="mocker-fidelity-")) / "tiny",
                               max_position_embeddings=32768)  # fmt: skip
    loads = workloads(Tokenizer.from_file(str(model_dir / "tokenizer.json")), args.requests)
    runs, cpu = {}, {}
    systems = {"stator": stator_server, "dynamo": dynamo_server}
    for name, make_server in systems.items():
        if args.only in (None, name):
            runs[name], cpu[name] = asyncio.run(run_system(make_server, args, model_dir, loads))
    if args.only in (None, "stator"):
        name = "stator in-process"
        runs[name], cpu[name] = asyncio.run(run_in_process(args, model_dir, loads))

    print("| workload | system | TTFT p50 ms | ITL p50 ms | prompt tokens | requests with "
          "cache hits | cached tokens | server CPU ms/request |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|")
    for w in loads:
        for system, res in runs.items():
            s = summarize(res[w.name])
            cpu_text = ", ".join(f"{k} {v * 1000:.1f}" for k, v in cpu[system][w.name].items())
            print(f"| {w.name} | {system} | {s['ttft_ms']:.1f} | {s['itl_ms']:.2f} | {s['prompt']:.0f} "
                  f"| {s['hits']}/{s['n']} | {s['cached']} | {cpu_text} |")  # fmt: skip
    if "dynamo" in runs:
        print()
        for w in loads:
            b = summarize(runs["dynamo"][w.name])
            for system in (name for name in runs if name != "dynamo"):
                a = summarize(runs[system][w.name])
                print(
                    f"{w.name}, {system}: TTFT {100 * (a['ttft_ms'] / b['ttft_ms'] - 1):+.0f}%, "
                    f"ITL {100 * (a['itl_ms'] / b['itl_ms'] - 1):+.0f}% vs Dynamo"
                )


if __name__ == "__main__":
    main()
