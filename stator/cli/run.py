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
    disagg: bool = option(
        False,
        "Disaggregated serving: --prefill-workers prefill and --decode-workers decode "
        "workers (instead of --workers aggregated ones), KV moved between them",
    )
    prefill_workers: int = option(1, "With --disagg: number of prefill workers")
    decode_workers: int = option(1, "With --disagg: number of decode workers")
    namespace: str = option("stator", "Namespace of the in-process fleet")


# Fields the run command sets itself: the workers' endpoint, role and status servers (an
# embedded fleet needs neither), and the migration limit (the router's flag).
FRONTEND_SKIPPED: frozenset[str] = frozenset()
WORKER_SKIPPED = frozenset({"system_port", "endpoint", "migration_limit", "role"})


def _config_classes() -> list[tuple[str, type, frozenset[str]]]:
    from stator.cli.worker import DOWNLOAD_FLAGS_SKIPPED
    from stator.frontend.config import FrontendConfig
    from stator.frontend.http.api_servers import ApiServerConfig
    from stator.router import RouterConfig
    from stator.worker.config import WorkerConfig
    from stator.worker.model_resolution import DownloadConfig

    return [
        ("stator run", RunConfig, frozenset()),
        ("worker", WorkerConfig, WORKER_SKIPPED),
        ("model download", DownloadConfig, DOWNLOAD_FLAGS_SKIPPED),
        ("HTTP", FrontendConfig, FRONTEND_SKIPPED),
        ("HTTP processes", ApiServerConfig, frozenset()),
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
    from stator.cli.frontend import check_processor
    from stator.cli.worker import build_engine_config, second_phase, worker_model_dir
    from stator.frontend.config import FrontendConfig
    from stator.frontend.http.api_servers import ApiServerConfig
    from stator.router import RouterConfig
    from stator.worker.config import WorkerConfig
    from stator.worker.model_resolution import DownloadConfig, ModelNotFound

    phase = second_phase(args, full_parser)
    if isinstance(phase, int):
        return phase
    spec, parsed = phase
    run_config = from_args(RunConfig, parsed)
    for name in ("workers", "prefill_workers", "decode_workers"):
        if getattr(run_config, name) < 1:
            flag = name.replace("_", "-")
            log.error("--%s must be at least 1, got %d", flag, getattr(run_config, name))
            return 2
    engine_config = build_engine_config(spec, parsed)
    router_config = from_args(RouterConfig, parsed)
    # One --migration-limit (the router's) serves both: the workers publish it in their
    # cards, the router applies it.
    worker_config = from_args(
        WorkerConfig, parsed, migration_limit=router_config.migration_limit or 0
    )
    frontend_config = from_args(FrontendConfig, parsed)
    servers = from_args(ApiServerConfig, parsed)
    try:
        servers.validate()
    except ValueError as exc:
        log.error("%s", exc)
        return 2
    try:
        check_processor(frontend_config.processor)
    except RuntimeError as exc:
        log.error("%s", exc)
        return 2
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
            servers.api_server_count,
            getattr(parsed, "log_level", "INFO"),
        )
    )


async def _serve(
    run_config,
    spec,
    engine_config,
    worker_config,
    frontend_config,
    router_config,
    model_dir,
    api_servers=1,
    log_level="INFO",
) -> int:
    """Serve under the runtime's `Lifecycle`, as `stator worker` and `stator frontend` do:
    SIGTERM/SIGINT stop HTTP service gracefully (in-flight responses finish), then the
    workers; exit 0. A second signal cuts the grace short. A worker whose engine dies, or
    a frontend that cannot serve, exits 1."""
    from stator.cli.worker import engine_config_for_role
    from stator.frontend.server import running_frontend
    from stator.runtime import Lifecycle, Runtime, RuntimeConfig
    from stator.worker.host import WorkerHost

    frontends = None
    if api_servers > 1:
        from stator.cli.run_api_servers import FrontendProcesses

        try:
            frontends = FrontendProcesses(
                api_servers, run_config.namespace, frontend_config, router_config
            )
        except OSError as exc:
            log.error("cannot bind the HTTP port: %s", exc)
            return 1

    def runtime_config() -> RuntimeConfig:
        if frontends is not None:  # found by the frontend processes, over TCP
            return frontends.runtime_config
        return RuntimeConfig(namespace=run_config.namespace, discovery="mem")

    served = worker_config.served_name(model_dir)
    hosts: list[tuple[WorkerHost, Runtime]] = []
    frontend_runtime = await Runtime.create(runtime_config())
    try:
        for role in worker_roles(run_config):
            runtime = await Runtime.create(runtime_config())
            config = dataclasses.replace(worker_config, role=role)
            if hasattr(engine_config, "role"):  # the mocker's own copy of the flag
                engine_config = dataclasses.replace(engine_config, role=role)
            engine = spec.factory(
                engine_config_for_role(engine_config, role), str(model_dir), served
            )
            host = WorkerHost(runtime, engine, config, model_dir=model_dir)
            hosts.append((host, runtime))
            await host.start()
    except Exception as exc:
        log.error("stator run failed: %s: %s", type(exc).__name__, exc)
        await _stop_all(hosts, frontend_runtime, grace=0)
        if frontends is not None:
            frontends.close()
        return 1
    if frontends is not None:
        await frontend_runtime.shutdown(grace=0)
        return await _serve_processes(frontends, hosts, served, spec.name, log_level)

    http_stop = asyncio.Event()

    async def serve() -> None:
        async with running_frontend(frontend_runtime, frontend_config, router_config) as front:
            # vLLM's processor builds vLLM's model config and renderer first: seconds on
            # an idle CPU, minutes on a busy one.
            ready = 600.0 if frontend_config.processor == "vllm" else 60.0
            await front.manager.wait_for_model(served, timeout=ready)
            # The one line a user waits for: where to point their client.
            if run_config.disagg:
                workers = (
                    f"{run_config.prefill_workers} prefill + "
                    f"{run_config.decode_workers} decode workers"
                )
            else:
                workers = f"{len(hosts)} worker(s)"
            print(
                f"stator is serving {served!r} ({spec.name} engine, {workers}) "
                f"at {front.base_url}/v1",
                flush=True,
            )
            await http_stop.wait()
        # Leaving the block stops uvicorn gracefully: in-flight responses finish.

    serving = asyncio.ensure_future(serve())
    lifecycle = Lifecycle(_RunDrain(frontend_runtime, hosts, http_stop, serving))
    for host, _ in hosts:
        host.on_fatal(lifecycle.fatal)
    return await lifecycle.run(serving)


async def _serve_processes(frontends, hosts, served, engine_name, log_level) -> int:
    """`--api-server-count N`: serve HTTP from N processes until a signal or a death."""
    from stator.cli.run_api_servers import ProcessesDrain
    from stator.runtime import Lifecycle

    frontends.start(log_level)
    grace = hosts[0][1].config.graceful_shutdown_timeout
    lifecycle = Lifecycle(ProcessesDrain(frontends, hosts, grace))
    for host, _ in hosts:
        host.on_fatal(lifecycle.fatal)

    async def serve() -> None:
        await frontends.wait_for_model(served)
        print(
            f"stator is serving {served!r} ({engine_name} engine, {len(hosts)} worker(s), "
            f"{frontends.count} API server processes) at {frontends.base_url}/v1",
            flush=True,
        )
        await frontends.wait_exit()
        if not lifecycle.stopping:
            raise RuntimeError("every API server process exited")

    return await lifecycle.run(serve())


def worker_roles(config: RunConfig) -> list[str]:
    """The role of each worker to start: decode ones first, so the model's card (which
    the frontend serves from) exists before any prefill worker's."""
    if not config.disagg:
        return ["aggregated"] * config.workers
    return ["decode"] * config.decode_workers + ["prefill"] * config.prefill_workers


class _RunDrain:
    """`stator run` as the lifecycle's `Drainable`: draining stops HTTP service (and waits
    for it), then stops the workers within what is left of the grace period."""

    def __init__(self, frontend_runtime, hosts, http_stop: asyncio.Event, serving) -> None:
        self.runtime = frontend_runtime
        self.hosts = hosts
        self.http_stop = http_stop
        self.serving = serving

    async def drain(self, grace: float | None = None) -> bool:
        if grace is None:
            grace = self.runtime.config.graceful_shutdown_timeout
        deadline = asyncio.get_running_loop().time() + grace
        self.http_stop.set()
        finished = True
        if not self.serving.done():
            done, _ = await asyncio.wait({asyncio.shield(self.serving)}, timeout=grace)
            finished = bool(done)
        for host, _ in self.hosts:
            left = max(0.0, deadline - asyncio.get_running_loop().time())
            finished = await host.stop(grace=left) and finished
        return finished

    async def shutdown(self, grace: float | None = 0.0) -> None:
        if not self.serving.done():
            self.serving.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self.serving
        await _stop_all(self.hosts, self.runtime, grace=0)


async def _stop_all(hosts, frontend_runtime, grace: float) -> None:
    for host, runtime in hosts:
        with contextlib.suppress(Exception):
            await host.stop(grace=grace)
        await runtime.shutdown(grace=0)
    await frontend_runtime.shutdown(grace=0)
