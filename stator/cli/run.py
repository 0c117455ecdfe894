"""`stator run`: the embedded default — frontend, router and N workers in one process.

Discovery is in-process (`mem`) and so is the request plane: nothing to start, no port but
the HTTP one. With no arguments it serves the small model bundled with stator on the
native engine. Engine flags come in a second parse, as for `stator worker`
(`stator run --engine mocker --help` lists the mocker's).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import logging
import signal
from typing import Any

from stator.config import add_flags, from_args, option

log = logging.getLogger(__name__)

DESCRIPTION = (
    "Serve a model with an OpenAI-compatible API from one process: frontend, router and "
    "workers, no servers to start. With no arguments: the bundled tiny model."
)


@dataclasses.dataclass
class RunConfig:
    engine: str = option(
        "native", "Engine: native | mocker | vllm | package.module:factory", metavar="ENGINE"
    )
    workers: int = option(1, "Number of workers (engines) behind the router")
    host: str = option("127.0.0.1", "Address the HTTP server binds (0.0.0.0: all)")
    port: int = option(8000, "HTTP port (0 = any free port)")
    namespace: str = option("stator", "Namespace of the in-process fleet")


# Fields the run command sets itself: the HTTP address (its --host/--port), the workers'
# endpoint and status servers (an embedded fleet needs neither), and the migration limit
# (the router's flag).
FRONTEND_SKIPPED = frozenset({"http_host", "http_port"})
WORKER_SKIPPED = frozenset({"system_port", "endpoint", "migration_limit"})


def _config_classes() -> list[tuple[str, type, frozenset[str]]]:
    from stator.cli.worker import DOWNLOAD_FLAGS_SKIPPED
    from stator.frontend.config import FrontendConfig
    from stator.router import RouterConfig
    from stator.worker.config import WorkerConfig
    from stator.worker.model_resolution import DownloadConfig

    return [
        ("stator run", RunConfig, frozenset()),
        ("worker", WorkerConfig, WORKER_SKIPPED),
        ("model download", DownloadConfig, DOWNLOAD_FLAGS_SKIPPED),
        ("HTTP", FrontendConfig, FRONTEND_SKIPPED),
        ("router", RouterConfig, frozenset()),
    ]


def _add_common_flags(parser: argparse.ArgumentParser) -> set[str]:
    parser.add_argument("-h", "--help", action="store_true", help="Show this help and exit")
    names = {"help"}
    for title, cls, skip in _config_classes():
        add_flags(parser.add_argument_group(title), cls, skip=skip)
        names |= {f.name for f in dataclasses.fields(cls)}
    return names


def full_parser(spec: Any) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="stator run", description=DESCRIPTION, add_help=False, allow_abbrev=False
    )
    common = _add_common_flags(parser)
    if spec is not None and spec.config_class is not None:
        add_flags(parser.add_argument_group(f"{spec.name} engine"), spec.config_class, skip=common)
        passthrough = getattr(spec.config_class, "add_passthrough_flags", None)
        if passthrough is not None:  # e.g. vLLM's engine arguments
            passthrough(parser)
    return parser


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "run", help=DESCRIPTION, description=DESCRIPTION, add_help=False, allow_abbrev=False
    )
    _add_common_flags(parser)
    parser.set_defaults(func=run, accepts_unknown=True)


def run(args: argparse.Namespace) -> int:
    from stator.cli.worker import build_engine_config, second_phase, worker_model_dir
    from stator.frontend.config import FrontendConfig
    from stator.router import RouterConfig
    from stator.worker.config import WorkerConfig
    from stator.worker.model_resolution import DownloadConfig, ModelNotFound

    phase = second_phase(args, full_parser)
    if isinstance(phase, int):
        return phase
    spec, parsed = phase
    run_config = from_args(RunConfig, parsed)
    if run_config.workers < 1:
        log.error("--workers must be at least 1, got %d", run_config.workers)
        return 2
    engine_config = build_engine_config(spec, parsed)
    router_config = from_args(RouterConfig, parsed)
    # One --migration-limit (the router's) serves both: the workers publish it in their
    # cards, the router applies it.
    worker_config = from_args(
        WorkerConfig, parsed, migration_limit=router_config.migration_limit or 0
    )
    frontend_config = from_args(
        FrontendConfig, parsed, http_host=run_config.host, http_port=run_config.port
    )
    try:
        model_dir = worker_model_dir(worker_config, from_args(DownloadConfig, parsed))
    except ModelNotFound as exc:
        log.error("%s", exc)
        return 2
    from stator.runtime.lifecycle import run_main

    return run_main(
        lambda: _serve(
            run_config,
            spec,
            engine_config,
            worker_config,
            frontend_config,
            router_config,
            model_dir,
        )
    )


async def _serve(
    run_config, spec, engine_config, worker_config, frontend_config, router_config, model_dir
) -> int:
    from stator.frontend.server import running_frontend
    from stator.runtime import Runtime, RuntimeConfig
    from stator.worker.host import WorkerHost

    def runtime_config() -> RuntimeConfig:
        return RuntimeConfig(namespace=run_config.namespace, discovery="mem")

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    served = worker_config.served_name(model_dir)
    hosts: list[tuple[WorkerHost, Runtime]] = []
    frontend_runtime = await Runtime.create(runtime_config())
    exit_code = 0
    try:
        for _ in range(run_config.workers):
            runtime = await Runtime.create(runtime_config())
            engine = spec.factory(engine_config, str(model_dir), served)
            host = WorkerHost(runtime, engine, worker_config, model_dir=model_dir)
            hosts.append((host, runtime))
            await host.start()
        async with running_frontend(frontend_runtime, frontend_config, router_config) as front:
            await front.manager.wait_for_model(served, timeout=60.0)
            # The one line a user waits for: where to point their client.
            print(
                f"stator is serving {served!r} ({spec.name} engine, {len(hosts)} worker(s)) "
                f"at {front.base_url}/v1",
                flush=True,
            )
            fatal = [asyncio.create_task(h.wait_fatal()) for h, _ in hosts]
            stopped = asyncio.create_task(stop.wait())
            done, _ = await asyncio.wait([stopped, *fatal], return_when=asyncio.FIRST_COMPLETED)
            for task in (stopped, *fatal):
                task.cancel()
            if stopped not in done:
                reason = next(iter(done)).result()
                log.error("a worker failed (%s); stopping", reason)
                exit_code = 1
    except Exception as exc:
        log.error("stator run failed: %s: %s", type(exc).__name__, exc)
        exit_code = 1
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)
        for host, runtime in hosts:
            with contextlib.suppress(Exception):
                await host.stop(grace=0 if exit_code else 5.0)
            await runtime.shutdown(grace=0)
        await frontend_runtime.shutdown(grace=0)
    return exit_code
