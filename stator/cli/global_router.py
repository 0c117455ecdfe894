"""`stator global-router`: pick a pool per request in front of several pools (namespaces
of workers). It joins the frontend's namespace as one worker serving every model the pools
serve; `stator frontend --global-router-config` embeds the same router instead."""

from __future__ import annotations

import argparse
import logging

from stator.config import add_flags, from_args

log = logging.getLogger(__name__)


def register(subparsers: argparse._SubParsersAction) -> None:
    from stator.global_router import GlobalRouterConfig
    from stator.router import RouterConfig
    from stator.runtime import RuntimeConfig

    parser = subparsers.add_parser(
        "global-router",
        help="Route each request to a pool of workers by its ISL and latency targets",
        description=__doc__,
    )
    add_flags(parser.add_argument_group("global router"), GlobalRouterConfig)
    add_flags(parser.add_argument_group("runtime"), RuntimeConfig)
    add_flags(parser.add_argument_group("router inside each pool"), RouterConfig)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from stator.global_router import ConfigError, GlobalRouterConfig, load_config
    from stator.global_router.service import run_standalone
    from stator.router import RouterConfig
    from stator.runtime import RuntimeConfig, run_main

    config = from_args(GlobalRouterConfig, args)
    if not config.global_router_config:
        log.error("--global-router-config is required")
        return 2
    try:
        load_config(config.global_router_config)
    except ConfigError as exc:
        log.error("%s", exc)
        return 2
    runtime_config = from_args(RuntimeConfig, args)
    router_config = from_args(RouterConfig, args)
    return run_main(lambda: run_standalone(config, runtime_config, router_config))
