"""Frontend overhead: CPU time per request of the frontend process, and TTFT seen by a
client, for 512-token prompts and 64 streamed output tokens.

The server process runs the frontend plus one in-process worker whose engine is the
`ScriptedEngine` test double (no delay: it answers at once), so the process's CPU is the
frontend's plus a small engine share; `--engine-only` measures that share alone (the engine
driven directly for the same requests) so it can be subtracted. The load generator is this
script's main process (aiohttp), whose CPU is not counted.

    python benchmarks/frontend_overhead.py --requests 400 --concurrency 8 64

`--processes` measures Dynamo's topology instead, against Dynamo 1.6.1 side by side: a
frontend process plus one mocker worker process at speedup 100 (stator: `stator frontend`
+ `stator worker --engine mocker`, file discovery, TCP request plane, ZMQ events; Dynamo:
its frontend + mocker + a loopback ZMQ broker), driven by `stator bench run` (one per
concurrency). It reports the frontend PID's CPU per request, and added TTFT: client TTFT p50 minus
the engine's own TTFT p50 (stator's mocker driven in-process through the Engine API with the
same prompts and concurrency; Dynamo's mocker uses the same timing polynomials).

    python benchmarks/frontend_overhead.py --processes --requests 400 --concurrency 8 64 \\
        --systems procs,dynamo,procs,dynamo

On a machine with cores to spare, `--pin CLIENT FRONTEND WORKER` keeps the three on CPUs
of their own, and `--api-server-count 1 2 4` runs stator's frontend with N HTTP processes
(`stator frontend --api-server-count N`), once per N:

    python benchmarks/frontend_overhead.py --processes --systems procs,procs \\
        --api-server-count 1 2 4 --pin 1 3-6 8 --concurrency 8 64 --client-nice -10
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

MODEL = "bench/scripted"
ENDPOINT = "stator.bench.generate"


def cpu_seconds(pid: int) -> tuple[float, float]:
    """(utime, stime) of a process in seconds, from /proc (Linux)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    return int(fields[11]) / ticks, int(fields[12]) / ticks


def prompt_text(model_dir: Path, tokens: int) -> str:
    """A user message whose chat prompt is about `tokens` tokens long."""
    from stator.llm import Tokenizer

    tok = Tokenizer.from_dir(model_dir)
    words = []
    while len(tok.encode(" ".join(words))) < tokens - 12:  # the template adds ~12 tokens
        words.append(f"word{len(words) % 97}")
    return " ".join(words)


# -- server side -------------------------------------------------------------------------


async def serve(
    model_dir: str,
    port: int,
    output_tokens: int,
    reasoning_parser: str | None = None,
    processor: str = "stator",
) -> None:
    from stator.frontend import FrontendConfig, running_frontend
    from stator.protocols import EngineRequest
    from stator.runtime import Runtime, RuntimeConfig
    from tests.fakes import ScriptedEngine
    from tests.frontend.harness import engine_handler

    engine = ScriptedEngine(MODEL, script=list(range(100, 100 + output_tokens)))
    worker = await Runtime.create(RuntimeConfig(discovery="mem"))
    await worker.serve(ENDPOINT, engine_handler(engine), EngineRequest)
    card = engine.model_card()
    card.source_path = model_dir
    card.reasoning_parser = reasoning_parser
    await worker.publish_model_card(ENDPOINT, card)
    runtime = await Runtime.create(RuntimeConfig(discovery="mem"))
    config = FrontendConfig(http_host="127.0.0.1", http_port=port, processor=processor)
    async with running_frontend(runtime, config) as frontend:
        await frontend.manager.wait_for_model(MODEL, timeout=600)
        print("READY", flush=True)
        await asyncio.Event().wait()


async def engine_only(count: int, prompt_tokens: int, output_tokens: int) -> float:
    """CPU seconds per request of the scripted engine behind the in-process request plane
    (what the server process spends that is not the frontend's)."""
    from stator.protocols import EngineOutput, EngineRequest, StopConditions
    from stator.runtime import Runtime, RuntimeConfig
    from tests.fakes import ScriptedEngine
    from tests.frontend.harness import engine_handler

    engine = ScriptedEngine(MODEL, script=list(range(100, 100 + output_tokens)))
    runtime = await Runtime.create(RuntimeConfig(discovery="mem:engine-only"))
    await runtime.serve(ENDPOINT, engine_handler(engine), EngineRequest)
    client = await runtime.client(ENDPOINT, EngineOutput)
    await client.wait_for_instances(1)
    iid = client.instance_ids()[0]
    ids = list(range(prompt_tokens))
    start = time.process_time()
    for i in range(count):
        req = EngineRequest(
            request_id=str(i), model=MODEL, token_ids=ids, stop=StopConditions(max_tokens=64)
        )
        async for _ in client.generate(iid, req):
            pass
    return (time.process_time() - start) / count


async def asgi_only(
    model_dir: str,
    text: str,
    count: int,
    output_tokens: int,
    reasoning_parser: str | None = None,
    processor: str = "stator",
) -> float:
    """CPU seconds per request of the app alone: the ASGI app called directly with an
    in-memory request (no sockets, no uvicorn), one request at a time, engine included."""
    from stator.frontend import FrontendMetrics, ModelManager, create_app
    from stator.protocols import EngineRequest
    from stator.router import RouterConfig
    from stator.runtime import Runtime, RuntimeConfig
    from tests.fakes import ScriptedEngine
    from tests.frontend.harness import engine_handler

    engine = ScriptedEngine(MODEL, script=list(range(100, 100 + output_tokens)))
    worker = await Runtime.create(RuntimeConfig(discovery="mem:asgi-only"))
    await worker.serve(ENDPOINT, engine_handler(engine), EngineRequest)
    card = engine.model_card()
    card.source_path = model_dir
    card.reasoning_parser = reasoning_parser
    await worker.publish_model_card(ENDPOINT, card)
    runtime = await Runtime.create(RuntimeConfig(discovery="mem:asgi-only"))
    metrics = FrontendMetrics()
    manager = ModelManager(runtime, RouterConfig(), metrics, processor=processor)
    await manager.start()
    await manager.wait_for_model(MODEL, timeout=600)
    app = create_app(manager, metrics)
    body = json.dumps(
        {
            "model": MODEL,
            "messages": [{"role": "user", "content": text}],
            "max_tokens": output_tokens,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
    ).encode()
    scope = {
        "type": "http", "asgi": {"version": "3.0", "spec_version": "2.4"}, "http_version": "1.1",
        "method": "POST", "scheme": "http", "path": "/v1/chat/completions", "raw_path": b"",
        "query_string": b"", "root_path": "", "server": ("127.0.0.1", 8000),
        "client": ("127.0.0.1", 5000), "headers": [(b"content-type", b"application/json")],
    }  # fmt: skip
    never = asyncio.Event()

    async def one() -> int:
        sent = False
        chunks = 0

        async def receive() -> dict:
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": body, "more_body": False}
            await never.wait()
            return {"type": "http.disconnect"}

        async def send(message: dict) -> None:
            nonlocal chunks
            if message["type"] == "http.response.body" and message.get("body"):
                chunks += 1

        await app(dict(scope), receive, send)
        return chunks

    for _ in range(20):
        await one()
    start = time.process_time()
    for _ in range(count):
        await one()
    return (time.process_time() - start) / count


# -- client side -------------------------------------------------------------------------


async def one_request(session, url: str, body: dict) -> tuple[float, int]:
    start = time.perf_counter()
    ttft = None
    chunks = 0
    async with session.post(url, json=body) as resp:
        assert resp.status == 200, await resp.text()
        async for line in resp.content:
            if line.startswith(b"data: {"):
                if ttft is None:
                    ttft = time.perf_counter() - start
                chunks += 1
    return ttft or 0.0, chunks


async def load(port: int, text: str, requests: int, concurrency: int, output_tokens: int):
    import aiohttp

    url = f"http://127.0.0.1:{port}/v1/chat/completions"
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": text}],
        "max_tokens": output_tokens,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    ttfts: list[float] = []
    queue = list(range(requests))
    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(connector=connector) as session:

        async def worker() -> None:
            while queue:
                queue.pop()
                ttft, _ = await one_request(session, url, body)
                ttfts.append(ttft)

        start = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        wall = time.perf_counter() - start
    return ttfts, wall


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=400)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[8, 64])
    parser.add_argument("--input-tokens", type=int, default=512)
    parser.add_argument("--output-tokens", type=int, default=64)
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument(
        "--reasoning-parser",
        help="serve the model with this reasoning parser (e.g. deepseek_r1: the scripted "
        "output has no think tags, so all of it is parsed as reasoning), to measure the "
        "parsed path; default: no parser",
    )
    parser.add_argument(
        "--processor",
        default="stator",
        choices=["stator", "vllm"],
        help="the frontend's processor (`stator frontend --processor`; vllm needs vLLM "
        "installed: run this script with the vLLM venv's python)",
    )
    parser.add_argument("--serve", metavar="MODEL_DIR", help=argparse.SUPPRESS)
    parser.add_argument("--processes", action="store_true", help="Dynamo's topology, vs Dynamo")
    parser.add_argument("--systems", default="procs,dynamo,procs,dynamo")
    parser.add_argument("--speedup-ratio", type=float, default=100.0)
    parser.add_argument("--dynamo-python", default="/work/dynamo-venv/bin/python")
    parser.add_argument(
        "--trace-frontend",
        action="store_true",
        help="--processes: run stator's frontend under benchmarks/ttft_probes.py (role "
        "`requests`) and print where each request's time to its first token goes",
    )
    parser.add_argument(
        "--client-nice",
        type=int,
        default=0,
        help="--processes: run the load generator at this nice value (e.g. -10: ahead of "
        "the servers, so that on a box with few cores its own wait for a CPU is not "
        "counted as added TTFT; needs root)",
    )
    parser.add_argument(
        "--pin",
        nargs=3,
        metavar=("CLIENT", "FRONTEND", "WORKER"),
        help="--processes, stator only: CPU lists (taskset's form: 3, 0-3, 0,2) that the "
        "load generator, the frontend and the mocker worker run on, e.g. `--pin 0-3 4 5`",
    )
    parser.add_argument(
        "--api-server-count",
        type=int,
        nargs="+",
        default=[1],
        help="--processes: run stator's frontend as `stator frontend --api-server-count N` "
        "once per N given (its CPU summed over the N server processes)",
    )
    parser.add_argument(
        "--frontend-flags",
        default="",
        help="--processes: more flags for `stator frontend`, one string, e.g. "
        '"--router-mode least-loaded"',
    )
    args = parser.parse_args()
    if args.trace_frontend and max(args.api_server_count) > 1:
        parser.error("--trace-frontend traces one frontend process: use --api-server-count 1")

    if args.processes:
        from frontend_processes import compare_processes

        compare_processes(args)
        return

    if args.serve:
        try:
            import uvloop

            uvloop.install()
        except ImportError:
            pass
        asyncio.run(
            serve(args.serve, args.port, args.output_tokens, args.reasoning_parser, args.processor)
        )
        return

    from tests.model_factory import make_model_dir
    from tests.procs import free_port, repo_env

    with tempfile.TemporaryDirectory() as tmp:
        model_dir = make_model_dir(Path(tmp) / "tiny", max_position_embeddings=4096)
        text = prompt_text(model_dir, args.input_tokens)
        port = args.port or free_port()
        server = subprocess.Popen(
            [sys.executable, __file__, "--serve", str(model_dir), "--port", str(port),
             "--output-tokens", str(args.output_tokens), "--processor", args.processor,
             *(["--reasoning-parser", args.reasoning_parser] if args.reasoning_parser else [])],
            env=repo_env(), stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        try:
            assert server.stdout is not None
            line = server.stdout.readline()
            assert line.strip() == "READY", f"server did not start: {line!r}"
            asyncio.run(load(port, text, 50, 4, args.output_tokens))  # warm up
            results = []
            for concurrency in args.concurrency:
                before = cpu_seconds(server.pid)
                ttfts, wall = asyncio.run(
                    load(port, text, args.requests, concurrency, args.output_tokens)
                )
                after = cpu_seconds(server.pid)
                user, system = after[0] - before[0], after[1] - before[1]
                cpu = user + system
                results.append(
                    {
                        "concurrency": concurrency,
                        "requests": args.requests,
                        "server_cpu_ms_per_request": round(1000 * cpu / args.requests, 3),
                        "of_which_kernel_ms": round(1000 * system / args.requests, 3),
                        "ttft_p50_ms": round(1000 * statistics.median(ttfts), 2),
                        "ttft_p90_ms": round(1000 * statistics.quantiles(ttfts, n=10)[-1], 2),
                        "requests_per_s": round(args.requests / wall, 1),
                    }
                )
        finally:
            server.terminate()
            server.wait(10)
        asgi_ms = 1000 * asyncio.run(
            asgi_only(
                str(model_dir),
                text,
                args.requests,
                args.output_tokens,
                args.reasoning_parser,
                args.processor,
            )
        )
    engine_ms = 1000 * asyncio.run(engine_only(200, args.input_tokens, args.output_tokens))
    print(json.dumps({"asgi_app_cpu_ms_per_request_incl_engine": round(asgi_ms, 3)}))
    for row in results:
        row["engine_cpu_ms_per_request"] = round(engine_ms, 3)
        row["frontend_cpu_ms_per_request"] = round(row["server_cpu_ms_per_request"] - engine_ms, 3)
        print(json.dumps(row))


if __name__ == "__main__":
    main()
