"""Does stator's mocker behave like Dynamo's? Same workloads, same parameters, both mockers.

Dynamo 1.6.1 (frontend + mocker, installed in a venv outside the repo, see
/work/shared/reference/dynamo-live.md) is driven over HTTP on 127.0.0.1 with a streaming
chat client. stator's mocker is driven in-process through the `Engine` API (stator's
frontend is not in main yet) with the same closed-loop client logic and the same prompts,
tokenized with the same tokenizer and chat template as Dynamo's frontend does.

    python benchmarks/mocker_fidelity.py --dynamo-python /work/dynamo-venv/bin/python

Prints one table row per (workload, system): TTFT and ITL medians and prefix-cache hits.
"""

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
from tests.model_factory import CHATML_TEMPLATE, make_model_dir

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
    out = [
        Workload(f"512-in/64-out c={c}", c, [p.text(512) for _ in range(requests)]) for c in (8, 32)
    ]
    prefixes = [p.text(448) for _ in range(8)]
    shared = [random.Random(i).choice(prefixes) + p.text(64) for i in range(requests)]
    out.append(Workload("shared prefix (8×448 + 64 unique) c=16", 16, shared))
    return out


_TEMPLATE = jinja2.Template(CHATML_TEMPLATE)


def render(text: str) -> str:
    return _TEMPLATE.render(
        messages=[{"role": "user", "content": text}], add_generation_prompt=True
    )


# -- closed-loop driver --------------------------------------------------------------


async def closed_loop(concurrency: int, prompts: list[str], one) -> list[Result]:
    queue = list(enumerate(prompts))
    results: list[Result] = []

    async def worker() -> None:
        while queue:
            i, prompt = queue.pop(0)
            results.append(await one(i, prompt))

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


class Dynamo:
    """Broker + mocker + frontend of Dynamo, all on loopback, stopped by PID."""

    def __init__(self, python: str, model_dir: Path, run_dir: Path, mocker_args: list[str]) -> None:
        self.port = free_port()
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
        log = open(run_dir / "dynamo.log", "w")  # noqa: SIM115 - closed in stop()
        self.log = log
        common = dict(env=env, stdout=log, stderr=subprocess.STDOUT)
        self.procs = [
            subprocess.Popen([python, "-c", BROKER, str(xsub), str(xpub)], **common),
            subprocess.Popen(
                [python, "-m", "dynamo.mocker", "--model-path", str(model_dir),
                 "--model-name", "tiny", *mocker_args],
                **common,
            ),
            subprocess.Popen(
                [python, "-m", "dynamo.frontend", "--http-host", "127.0.0.1",
                 "--http-port", str(self.port), "--router-mode", "round-robin"],
                **common,
            ),
        ]  # fmt: skip
        self.url = f"http://127.0.0.1:{self.port}"

    async def wait_ready(self, session: aiohttp.ClientSession, timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for p in self.procs:
                if p.poll() is not None:
                    raise RuntimeError(f"a Dynamo process exited ({p.args[:3]}); see dynamo.log")
            try:
                await self.chat(session, 0, " hello", max_tokens=1)
                return
            except (aiohttp.ClientError, RuntimeError, KeyError, IndexError):
                await asyncio.sleep(0.5)
        raise TimeoutError("Dynamo did not become ready")

    async def chat(self, session, i: int, prompt: str, max_tokens: int = OSL) -> Result:
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


async def run_dynamo(args, model_dir: Path, loads: list[Workload]) -> dict[str, list[Result]]:
    run_dir = Path(tempfile.mkdtemp(prefix="dynamo-fidelity-"))
    mocker_args = [
        "--num-gpu-blocks-override", str(args.num_gpu_blocks), "--block-size", str(args.block_size),
        "--max-num-seqs", "256", "--max-num-batched-tokens", "8192",
        "--speedup-ratio", str(args.speedup_ratio),
    ]  # fmt: skip
    server = Dynamo(args.dynamo_python, model_dir, run_dir, mocker_args)
    out = {}
    try:
        timeout = aiohttp.ClientTimeout(total=600)
        conn = aiohttp.TCPConnector(limit=0)
        async with aiohttp.ClientSession(timeout=timeout, connector=conn) as session:
            await server.wait_ready(session)
            for w in loads:
                await closed_loop(w.concurrency, [f" warm up {i}" for i in range(w.concurrency)],
                                  lambda i, p: server.chat(session, i, p))  # fmt: skip
                out[w.name] = await closed_loop(
                    w.concurrency, w.prompts, lambda i, p: server.chat(session, i, p)
                )
    finally:
        server.stop()
    print(f"(Dynamo logs in {run_dir})", file=sys.stderr)
    return out


# -- stator in-process ---------------------------------------------------------------


async def run_stator(args, model_dir: Path, loads: list[Workload]) -> dict[str, list[Result]]:
    tok = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    config = MockerConfig(
        num_gpu_blocks=args.num_gpu_blocks,
        block_size=args.block_size,
        speedup_ratio=args.speedup_ratio,
    )
    engine = create_engine(config, str(model_dir), "tiny")
    await engine.start()
    counter = 0
    # Tokenize up front: the client shares the engine's event loop, and tokenizing inside
    # the loop would delay the other clients' arrivals.
    texts = {p for w in loads for p in w.prompts} | {f" warm up {i}" for i in range(64)}
    encoded = {t: tok.encode(render(t), add_special_tokens=False).ids for t in texts}

    async def one(i: int, prompt: str) -> Result:
        nonlocal counter
        counter += 1
        ids = encoded[prompt]
        req = EngineRequest(
            request_id=f"r{counter}",
            model="tiny",
            token_ids=ids,
            stop=StopConditions(max_tokens=OSL, min_tokens=OSL, ignore_eos=True),
        )
        stamps, cached = [], 0
        start = time.perf_counter()
        async for out in engine.generate(req):
            if out.cached_tokens is not None:
                cached = out.cached_tokens
            if out.token_ids:
                stamps.append((time.perf_counter(), len(out.token_ids)))
        return result(start, stamps, len(ids), cached)

    out = {}
    try:
        for w in loads:
            await closed_loop(w.concurrency, [f" warm up {i}" for i in range(w.concurrency)], one)
            out[w.name] = await closed_loop(w.concurrency, w.prompts, one)
    finally:
        await engine.shutdown()
    return out


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
    parser.add_argument("--requests", type=int, default=160)
    parser.add_argument("--speedup-ratio", type=float, default=1.0)
    parser.add_argument("--num-gpu-blocks", type=int, default=16384)
    parser.add_argument("--block-size", type=int, default=64)
    parser.add_argument("--only", choices=["stator", "dynamo"], default=None)
    args = parser.parse_args()

    model_dir = make_model_dir(Path(tempfile.mkdtemp(prefix="mocker-fidelity-")) / "tiny",
                               max_position_embeddings=32768)  # fmt: skip
    loads = workloads(Tokenizer.from_file(str(model_dir / "tokenizer.json")), args.requests)
    runs = {}
    if args.only != "dynamo":
        runs["stator"] = asyncio.run(run_stator(args, model_dir, loads))
    if args.only != "stator":
        runs["dynamo"] = asyncio.run(run_dynamo(args, model_dir, loads))

    print(
        "| workload | system | TTFT p50 ms | ITL p50 ms | prompt tokens | requests with cache hits | cached tokens |"
    )
    print("|---|---|---|---|---|---|---|")
    for w in loads:
        for system, res in runs.items():
            s = summarize(res[w.name])
            print(f"| {w.name} | {system} | {s['ttft_ms']:.1f} | {s['itl_ms']:.2f} | {s['prompt']:.0f} "
                  f"| {s['hits']}/{s['n']} | {s['cached']} |")  # fmt: skip
    if len(runs) == 2:
        print()
        for w in loads:
            a, b = summarize(runs["stator"][w.name]), summarize(runs["dynamo"][w.name])
            print(f"{w.name}: TTFT {100 * (a['ttft_ms'] / b['ttft_ms'] - 1):+.0f}%, "
                  f"ITL {100 * (a['itl_ms'] / b['itl_ms'] - 1):+.0f}% vs Dynamo")  # fmt: skip


if __name__ == "__main__":
    main()
