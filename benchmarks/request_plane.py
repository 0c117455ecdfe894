"""TCP request-plane benchmark: two processes, a server and a caller, on this host.

Measures
- frames/s: one stream of many small `EngineOutput` frames, and many concurrent streams;
- streams/s: short streams (one request, one response frame), many in flight;
- added latency per frame: the server stamps each frame with CLOCK_MONOTONIC (one clock
  for every process on Linux) as it yields it, the caller subtracts on arrival; frames
  are paced 1 ms apart so that the number is latency, not queueing.

    python benchmarks/request_plane.py [--frames 200000] [--streams 20000]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import msgspec

from stator.protocols import EngineOutput
from stator.runtime.lifecycle import run_main
from stator.runtime.request_plane.tcp import TcpClient, TcpServer


class Job(msgspec.Struct):
    n: int
    pace_us: int = 0


class Stamped(msgspec.Struct, array_like=True):
    sent_ns: int
    token: int


async def serve(port_file: str) -> int:
    server = TcpServer("127.0.0.1", 0)
    await server.start()

    async def frames(job: Job):
        for i in range(job.n):
            yield EngineOutput(token_ids=[i])

    async def paced(job: Job):
        for i in range(job.n):
            await asyncio.sleep(job.pace_us / 1e6)
            yield Stamped(time.monotonic_ns(), i)

    server.register("bench.rp.frames", frames, Job)
    server.register("bench.rp.paced", paced, Job)
    Path(port_file).write_text(server.address)
    await asyncio.Event().wait()
    return 0


async def bench(address: str, args: argparse.Namespace) -> list[tuple[str, str]]:
    client = TcpClient()
    rows: list[tuple[str, str]] = []

    async def drain(endpoint: str, job: Job, kind) -> int:
        count = 0
        async for _ in client.stream(address, endpoint, job, kind):
            count += 1
        return count

    await drain("bench.rp.frames", Job(1000), EngineOutput)  # connect, warm up

    start = time.perf_counter()
    got = await drain("bench.rp.frames", Job(args.frames), EngineOutput)
    elapsed = time.perf_counter() - start
    rows.append(("frames/s, 1 stream", f"{got / elapsed:,.0f}"))

    per = args.frames // args.concurrency
    start = time.perf_counter()
    counts = await asyncio.gather(
        *(drain("bench.rp.frames", Job(per), EngineOutput) for _ in range(args.concurrency))
    )
    elapsed = time.perf_counter() - start
    rows.append((f"frames/s, {args.concurrency} streams", f"{sum(counts) / elapsed:,.0f}"))

    sem = asyncio.Semaphore(args.concurrency)

    async def short() -> None:
        async with sem:
            await drain("bench.rp.frames", Job(1), EngineOutput)

    start = time.perf_counter()
    await asyncio.gather(*(short() for _ in range(args.streams)))
    elapsed = time.perf_counter() - start
    rows.append(
        (
            f"streams/s (1 frame each, {args.concurrency} in flight)",
            f"{args.streams / elapsed:,.0f}",
        )
    )

    latencies = []
    async for item in client.stream(
        address, "bench.rp.paced", Job(args.latency_frames, pace_us=1000), Stamped
    ):
        latencies.append((time.monotonic_ns() - item.sent_ns) / 1000)
    latencies.sort()
    p50 = statistics.median(latencies)
    p99 = latencies[int(len(latencies) * 0.99) - 1]
    rows.append(("added latency per frame, p50", f"{p50:.0f} µs"))
    rows.append(("added latency per frame, p99", f"{p99:.0f} µs"))
    await client.close()
    return rows


def raw_loopback_latency(frames: int) -> tuple[float, float]:
    """Baseline: one-way latency of bare 8-byte sends over loopback TCP between two
    processes (blocking sockets, no event loop, no encoding), paced the same way."""
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    pid = os.fork()
    if pid == 0:
        conn, _ = listener.accept()
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        for _ in range(frames):
            time.sleep(0.001)
            conn.sendall(time.monotonic_ns().to_bytes(8, "big"))
        os._exit(0)
    latencies = []
    with socket.create_connection(("127.0.0.1", port)) as conn:
        for _ in range(frames):
            data = b""
            while len(data) < 8:
                data += conn.recv(8 - len(data))
            latencies.append((time.monotonic_ns() - int.from_bytes(data, "big")) / 1000)
    os.waitpid(pid, 0)
    listener.close()
    latencies.sort()
    return statistics.median(latencies), latencies[int(len(latencies) * 0.99) - 1]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--frames", type=int, default=200_000)
    parser.add_argument("--streams", type=int, default=20_000)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--latency-frames", type=int, default=2000)
    parser.add_argument("--serve", metavar="PORT_FILE", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        return run_main(lambda: serve(args.serve))

    port_file = Path(f"/tmp/stator-bench-rp-{os.getpid()}")
    server = subprocess.Popen([sys.executable, __file__, "--serve", str(port_file)])
    try:
        deadline = time.monotonic() + 30
        while not port_file.exists() or not port_file.read_text():
            if time.monotonic() > deadline or server.poll() is not None:
                raise SystemExit("benchmark server did not start")
            time.sleep(0.05)
        address = port_file.read_text()
        rows = run_main(lambda: bench(address, args))
    finally:
        server.kill()
        server.wait()
        port_file.unlink(missing_ok=True)
    p50, p99 = raw_loopback_latency(args.latency_frames)
    rows.append(("baseline: bare loopback TCP send, p50", f"{p50:.0f} µs"))
    rows.append(("baseline: bare loopback TCP send, p99", f"{p99:.0f} µs"))
    width = max(len(name) for name, _ in rows)
    print(f"{'TCP request plane (2 processes, uvloop)':<{width}}  value")
    for name, value in rows:
        print(f"{name:<{width}}  {value}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
