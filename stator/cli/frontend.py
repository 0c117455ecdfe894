"""`stator frontend`: the OpenAI-compatible HTTP server. It discovers models from the
workers' model cards and routes requests to them. With `--api-server-count N`, N such
processes serve the port together (`stator.frontend.http.api_servers`)."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import logging

from stator.config import add_flags, from_args

log = logging.getLogger(__name__)


def check_processor(kind: str) -> None:
    """Fail at start, once, where `--processor vllm` cannot work (vLLM not installed)."""
    if kind == "vllm":
        from stator.frontend.processor.vllm import require_vllm

        require_vllm()


def register(subparsers: argparse._SubParsersAction) -> None:
    from stator.frontend.config import FrontendConfig
    from stator.frontend.http.api_servers import ApiServerConfig
    from stator.global_router import GlobalRouterConfig
    from stator.router import RouterConfig
    from stator.runtime import RuntimeConfig

    parser = subparsers.add_parser(
        "frontend",
        help="Serve the OpenAI-compatible HTTP API in front of discovered workers",
        description=__doc__,
    )
    http = parser.add_argument_group("HTTP")
    processes = parser.add_argument_group("HTTP processes")
    runtime = parser.add_argument_group("runtime")
    # The runtime's flags first: its --host (the TCP planes' address) wins over the HTTP
    # group's --host alias, which only `stator run` keeps.
    add_flags(runtime, RuntimeConfig)
    add_flags(http, FrontendConfig)
    add_flags(processes, ApiServerConfig)
    add_flags(parser.add_argument_group("router"), RouterConfig)
    add_flags(parser.add_argument_group("global router (pools)"), GlobalRouterConfig)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from stator.frontend.config import FrontendConfig
    from stator.frontend.http.api_servers import ApiServerConfig
    from stator.global_router import GlobalRouterConfig, load_config
    from stator.router import RouterConfig
    from stator.runtime import RuntimeConfig, run_main

    frontend_config = from_args(FrontendConfig, args)
    runtime_config = from_args(RuntimeConfig, args)
    router_config = from_args(RouterConfig, args)
    servers = from_args(ApiServerConfig, args)
    pools = from_args(GlobalRouterConfig, args)
    try:
        servers.validate()
        check_processor(frontend_config.processor)
        if pools.global_router_config:
            load_config(pools.global_router_config)  # a bad file fails here, once
    except (ValueError, RuntimeError) as exc:
        log.error("%s", exc)
        return 2
    if servers.api_server_count == 1:
        return run_main(lambda: _main(runtime_config, frontend_config, router_config, pools))
    return _run_api_servers(
        servers.api_server_count,
        args.log_level,
        runtime_config,
        frontend_config,
        router_config,
        pools,
    )


def _run_api_servers(
    count, log_level, runtime_config, frontend_config, router_config, pools
) -> int:
    from stator.frontend.http.api_servers import reuse_port_socket, run_api_servers

    host = frontend_config.http_host
    try:
        # Held (bound, not listening) while the servers run: it turns port 0 into one
        # port for all of them, and a port another program holds fails here, once.
        held = reuse_port_socket(host, frontend_config.http_port)
    except OSError as exc:
        log.error("cannot bind %s:%d: %s", host, frontend_config.http_port, exc)
        return 1
    with held:
        port = held.getsockname()[1]
        frontend_config = dataclasses.replace(frontend_config, http_port=port)
        if not router_config.router_replica_sync and _router_reads_load(router_config):
            log.info("--api-server-count %d: turning on --router-replica-sync", count)
            router_config = dataclasses.replace(router_config, router_replica_sync=True)
        log.info("%d frontend processes serving http://%s:%d", count, host, port)
        return run_api_servers(
            count, _serve_one, (log_level, runtime_config, frontend_config, router_config, pools)
        )


def _router_reads_load(config) -> bool:
    """Whether the router's choices or admission read its booked load, which the servers
    then must share. round-robin, random and direct without busy thresholds never do: for
    them replica sync would be 3 messages per request sent and received for nothing."""
    return config.router_mode in ("power-of-two", "least-loaded", "kv") or (
        config.active_decode_blocks_threshold is not None
        or config.active_prefill_tokens_threshold is not None
    )


def _serve_one(log_level, runtime_config, frontend_config, router_config, pools) -> int:
    """One of the `--api-server-count` processes (a fresh interpreter)."""
    from stator.logs import setup_logging
    from stator.runtime import run_main

    setup_logging(log_level)
    return run_main(
        lambda: _main(runtime_config, frontend_config, router_config, pools, reuse_port=True)
    )


async def _main(runtime_config, frontend_config, router_config, pools, reuse_port=False) -> int:
    """Serve under the runtime's `Lifecycle`, as workers do: SIGTERM/SIGINT stop HTTP
    service gracefully (in-flight responses finish) and exit 0; a second signal cuts the
    grace short; a serving failure (e.g. the port is taken) exits 1."""
    from stator.frontend.http.drain import FrontendDrain
    from stator.frontend.metrics import FrontendMetrics
    from stator.frontend.server import serve_frontend
    from stator.global_router import build_global_router
    from stator.runtime import Lifecycle, Runtime

    runtime = await Runtime.create(runtime_config)
    metrics = FrontendMetrics()
    global_router = None
    if pools.global_router_config:
        global_router = build_global_router(
            pools, runtime_config, router_config, registry=metrics.registry
        )
        await global_router.start()
    stop = asyncio.Event()
    serving = asyncio.ensure_future(
        serve_frontend(
            runtime,
            frontend_config,
            router_config,
            stop=stop,
            handle_signals=False,
            reuse_port=reuse_port,
            routes=global_router,
            metrics=metrics,
        )
    )
    drain = FrontendDrain(runtime, stop, serving)
    lifecycle = Lifecycle(drain, grace=runtime_config.graceful_shutdown_timeout)
    if global_router is not None:
        lifecycle.on_stop(global_router.close)
    return await lifecycle.run(serving)
