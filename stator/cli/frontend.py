"""`stator frontend`: the OpenAI-compatible HTTP server. It discovers models from the
workers' model cards and routes requests to them."""

from __future__ import annotations

import argparse
import asyncio

from stator.config import add_flags, from_args


def register(subparsers: argparse._SubParsersAction) -> None:
    from stator.frontend.config import FrontendConfig
    from stator.router import RouterConfig
    from stator.runtime import RuntimeConfig

    parser = subparsers.add_parser(
        "frontend",
        help="Serve the OpenAI-compatible HTTP API in front of discovered workers",
        description=__doc__,
    )
    add_flags(parser.add_argument_group("HTTP"), FrontendConfig)
    add_flags(parser.add_argument_group("runtime"), RuntimeConfig)
    add_flags(parser.add_argument_group("router"), RouterConfig)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from stator.frontend.config import FrontendConfig
    from stator.router import RouterConfig
    from stator.runtime import RuntimeConfig, run_main

    frontend_config = from_args(FrontendConfig, args)
    runtime_config = from_args(RuntimeConfig, args)
    router_config = from_args(RouterConfig, args)
    return run_main(lambda: _main(runtime_config, frontend_config, router_config))


async def _main(runtime_config, frontend_config, router_config) -> int:
    """Serve under the runtime's `Lifecycle`, as workers do: SIGTERM/SIGINT stop HTTP
    service gracefully (in-flight responses finish) and exit 0; a second signal cuts the
    grace short; a serving failure (e.g. the port is taken) exits 1."""
    from stator.frontend.drain import FrontendDrain
    from stator.frontend.server import serve_frontend
    from stator.runtime import Lifecycle, Runtime

    runtime = await Runtime.create(runtime_config)
    stop = asyncio.Event()
    serving = asyncio.ensure_future(
        serve_frontend(runtime, frontend_config, router_config, stop=stop, handle_signals=False)
    )
    drain = FrontendDrain(runtime, stop, serving)
    lifecycle = Lifecycle(drain, grace=runtime_config.graceful_shutdown_timeout)
    return await lifecycle.run(serving)
