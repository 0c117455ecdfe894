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
    from stator.runtime import RuntimeConfig

    frontend_config = from_args(FrontendConfig, args)
    runtime_config = from_args(RuntimeConfig, args)
    router_config = from_args(RouterConfig, args)
    _install_uvloop()
    asyncio.run(_main(runtime_config, frontend_config, router_config))
    return 0


def _install_uvloop() -> None:
    try:
        import uvloop
    except ImportError:
        return
    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())


async def _main(runtime_config, frontend_config, router_config) -> None:
    from stator.frontend.server import serve_frontend
    from stator.runtime import Runtime

    runtime = await Runtime.create(runtime_config)
    try:
        await serve_frontend(runtime, frontend_config, router_config)
    finally:
        await runtime.shutdown()
