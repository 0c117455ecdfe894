"""`stator planner`: keep each pool's worker count where its TTFT/ITL targets hold (or its
KV usage and queues within thresholds), applying decisions through a connector.

    stator planner --profile p.json --frontend-url http://127.0.0.1:8000 \\
        --worker-args "--engine mocker --model M --discovery file:/tmp/d" \\
        --discovery file:/tmp/d --ttft-target 800 --itl-target 60
    stator planner --replay observations.jsonl --profile p.json   # decisions, offline
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from pathlib import Path

from stator.config import add_flags, from_args

log = logging.getLogger(__name__)


def register(subparsers: argparse._SubParsersAction) -> None:
    from stator.planner.config import PlannerConfig
    from stator.planner.service import PlannerServiceConfig
    from stator.runtime import RuntimeConfig

    parser = subparsers.add_parser(
        "planner",
        help="Scale workers per pool to meet TTFT/ITL targets (SLA) or load thresholds",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_flags(parser.add_argument_group("planning"), PlannerConfig)
    add_flags(parser.add_argument_group("inputs and connector"), PlannerServiceConfig)
    add_flags(parser.add_argument_group("runtime"), RuntimeConfig)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import msgspec

    from stator.planner.config import PlannerConfig
    from stator.planner.core import replay
    from stator.planner.profile import PerfProfile
    from stator.planner.service import PlannerServiceConfig
    from stator.runtime import RuntimeConfig, run_main

    config = from_args(PlannerConfig, args)
    service = from_args(PlannerServiceConfig, args)
    runtime_config = from_args(RuntimeConfig, args)
    try:
        config.validate()
        profile = PerfProfile.load(config.profile) if config.profile else None
        if service.replay:
            lines = Path(service.replay).read_text().splitlines()
            for decision in replay(config, profile, lines):
                sys.stdout.write(msgspec.json.encode(decision).decode() + "\n")
            return 0
    except (ValueError, OSError) as exc:
        log.error("%s", exc)
        return 2
    return run_main(lambda: _main(config, service, runtime_config, profile))


async def _main(config, service, runtime_config, profile) -> int:
    from stator.planner.health import StatusServer
    from stator.planner.service import (
        PlannerMetrics,
        PlannerService,
        build_connector,
        build_reader,
    )

    pools = service.pools or [runtime_config.namespace]
    try:
        connector = build_connector(service, config.gpus_per_worker, pools)
    except (ValueError, ImportError) as exc:
        log.error("%s", exc)
        return 2
    metrics = PlannerMetrics()
    planner = PlannerService(
        config, service, runtime_config, connector, build_reader(service), profile, metrics
    )
    status = None
    if service.metrics_port:
        status = StatusServer(metrics.registry, planner.health, service.metrics_port)
        await status.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    import signal

    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await planner.start()
    try:
        await planner.run(stop)
    finally:
        await planner.close()
        if connector is not None:
            await connector.close()
        if status is not None:
            await status.stop()
    return 0
