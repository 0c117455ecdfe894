"""A small serving process for the runtime's multi-process tests: it uses `Runtime` and
`Lifecycle` directly (no worker host) to serve

- `test.echo.generate`: request {"n", "delay", "tag"} -> n items {"i", "pid"}, one every
  `delay` seconds; when the stream ends, `<marker_dir>/<tag>.<how>` is written, where how
  is `done` (ran to the end) or `closed` (the caller closed it early);
- `test.echo.fatal`: makes the process fail as if its engine died (exit code 1);

and publishes {"pid", "seq"} on the `load` topic every 0.1 s. It prints `READY <instance
id hex>` once serving.

    python -m tests.runtime.echo_server --discovery file:/tmp/d --marker-dir /tmp/m
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
from pathlib import Path

from stator.runtime import Runtime, RuntimeConfig
from stator.runtime.lifecycle import Lifecycle, run_main


async def main(args: argparse.Namespace) -> int:
    config = RuntimeConfig(
        discovery=args.discovery,
        discovery_ttl=args.ttl,
        request_plane="tcp",
        event_plane=args.event_plane,
        graceful_shutdown_timeout=args.grace,
    )
    runtime = await Runtime.create(config)
    lifecycle = Lifecycle(runtime)
    markers = Path(args.marker_dir)

    async def generate(request: dict):
        how = "closed"
        try:
            for i in range(request["n"]):
                if request.get("delay"):
                    await asyncio.sleep(request["delay"])
                yield {"i": i, "pid": os.getpid()}
            how = "done"
        finally:
            (markers / f"{request['tag']}.{how}").write_text(str(os.getpid()))

    async def fatal(request: dict):
        lifecycle.fatal("told to die by the test")
        yield {"ok": True}

    async def publish_load():
        seq = 0
        while True:
            await runtime.publish("load", {"pid": os.getpid(), "seq": seq})
            seq += 1
            await asyncio.sleep(0.1)

    async def serve():
        await runtime.serve("test.echo.generate", generate, dict)
        await runtime.serve("test.echo.fatal", fatal, dict)
        print(f"READY {runtime.instance_id:x}", flush=True)
        await publish_load()

    return await lifecycle.run(serve())


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--discovery", required=True)
    parser.add_argument("--event-plane", default="zmq")
    parser.add_argument("--ttl", type=float, default=2.0)
    parser.add_argument("--grace", type=float, default=30.0)
    parser.add_argument("--marker-dir", required=True)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    raise SystemExit(run_main(lambda: main(args)))
